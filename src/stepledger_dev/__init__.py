"""Development tooling, not the library: the local brokers (Tansu, Apache Kafka), the
local stack, the example tool services and agents, ``stepledger demo`` and the chaos
harness.  Only stepledger.cli imports this package (an import contract checks it)."""
