"""stepledger benchmarks: each module's ``run(quick, bootstrap)`` returns rows of ratios."""
