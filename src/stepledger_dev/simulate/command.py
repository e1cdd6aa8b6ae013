"""``stepledger simulate``: explore seeds, or replay one schedule exactly."""

from __future__ import annotations

import logging
from pathlib import Path

import click


@click.command()
@click.option("--seeds", default=100, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option(
    "--seed",
    default=None,
    type=int,
    help="The first seed [1]; with --schedule, the seed to replay it under (default: its own).",
)
@click.option(
    "--steps",
    type=click.IntRange(10, 1_000_000),
    default=None,
    help="Turns with faults per run (default: the plan's, 600).",
)
@click.option(
    "--schedule",
    default=None,
    help="Replay this schedule (the JSON line a failure prints, or @FILE holding it).",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Also draw the variants that reach defects still open on main (see plan.PENDING).",
)
@click.option("--no-shrink", is_flag=True, help="Report failures as found, unshrunk.")
@click.option("--trace", "full_trace", is_flag=True, help="Print a replay's whole trace.")
def simulate(
    seeds: int,
    seed: int | None,
    steps: int | None,
    schedule: str | None,
    everything: bool,
    no_shrink: bool,
    full_trace: bool,
    defect: tuple[str, ...] = (),
) -> None:
    """Run the whole protocol in one process under seeded schedules; check every invariant.

    No broker, no network: agents, the recovery daemon, the projector's fold and people
    answering the queue run as actors of one seeded scheduler, with faults (pauses, kills,
    skewed clocks, lost acknowledgements, duplicates, foreign records) as its choices.
    A violation prints its seed, its shrunk schedule, the trace that shows it and the
    command that replays it.
    """
    from dataclasses import replace

    from stepledger_dev.simulate import explore, plan, world

    logging.getLogger("stepledger").setLevel(logging.CRITICAL)  # the actors' own log lines
    if schedule is not None:
        text = Path(schedule[1:]).read_text() if schedule.startswith("@") else schedule
        try:
            replayed = plan.Plan.decode(text.strip())
        except (ValueError, KeyError, TypeError) as exc:
            raise click.BadParameter(f"not a schedule: {exc}", param_hint="--schedule") from None
        if seed is not None:
            replayed = replace(replayed, seed=seed)
        if steps is not None:
            replayed = replace(replayed, turns=steps)
        if defect:
            replayed = replace(replayed, defects=defect)
        elif replayed.defects and "defect" not in click.get_current_context().params:
            raise click.UsageError(
                "this schedule switches old behaviours back on (test-only): replay it with "
                "`python -m stepledger_dev.simulate --schedule ...`"
            )
        _replay(world.run(replayed), full_trace)
        return
    profile = plan.FULL if everything else plan.Profile()
    report = explore.explore(
        1 if seed is None else seed,
        seeds,
        profile,
        turns=steps,
        defects=defect,
        shrinking=not no_shrink,
        on_failure=_print_failure,
    )
    known = len(report.failures) - len(report.new)
    click.echo(
        f"{report.seeds} seeds in {report.seconds:.1f}s ({report.rate:.1f} seeds/s): "
        f"{len(report.new)} violation(s), {known} of known open defects"
    )
    if report.new:
        raise SystemExit(1)


def _print_failure(failure: object) -> None:
    from stepledger_dev.simulate.explore import Failure
    from stepledger_dev.simulate.shrink import story

    assert isinstance(failure, Failure)
    violation = failure.outcome.violations[0]
    if failure.known is not None:
        click.echo(f"seed {failure.seed}: known open defect: {violation.line()}")
        click.echo(f"  ({failure.known.reason})")
        return
    click.echo(f"VIOLATION seed {failure.seed}: {violation.line()}", err=True)
    shown = failure.outcome if failure.shrunk is None else failure.shrunk.outcome
    if failure.shrunk is not None:
        click.echo(f"  shrunk in {failure.shrunk.runs} runs to: {shown.violations[0].line()}")
    for line in story(shown):
        click.echo(f"  {line}")
    line = shown.plan.encode()
    prog = "python -m stepledger_dev.simulate" if shown.plan.defects else "stepledger simulate"
    click.echo(f"  replay: {prog} --seed {shown.plan.seed} --schedule '{line}'")


def _replay(outcome: object, full: bool) -> None:
    from stepledger_dev.simulate.shrink import story
    from stepledger_dev.simulate.world import Outcome

    assert isinstance(outcome, Outcome)
    lines = outcome.trace if full or not outcome.failed else story(outcome)
    for line in lines:
        click.echo(line)
    for name, ended in sorted(outcome.ended.items()):
        click.echo(f"{name}: {ended[:200]}")
    if outcome.failed:
        click.echo(f"VIOLATION {outcome.violations[0].line()}", err=True)
        raise SystemExit(1)
    click.echo(f"no violation in {outcome.turns} turns ({outcome.ms} ms simulated)")


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(simulate)
