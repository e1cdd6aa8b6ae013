"""``stepledger chaos``, the crash-window fault-injection harness."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Literal

import click


@click.command()
@click.option("--workflows", default=200, show_default=True, type=click.IntRange(1, 5000))
@click.option("--seed", default=1, show_default=True, type=int, help="Replays a run exactly.")
@click.option(
    "--duration",
    default=600.0,
    show_default=True,
    type=click.FloatRange(10),
    help="Time budget in seconds; running out is itself a failure.",
)
@click.option(
    "--bootstrap",
    envvar="STEPLEDGER_BOOTSTRAP",
    default=None,
    help="Your broker (default: a local broker on loopback).",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the JSON report (default: chaos-report.json in the work directory).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep logs, state and the report here (default: a new directory under "
    "the system temp dir, kept).",
)
@click.option(
    "--durable-broker",
    is_flag=True,
    help="Local broker on durable loopback S3 storage, restarted gracefully during the run "
    "(slow: keep --workflows small).",
)
@click.option(
    "--engine",
    type=click.Choice(["tansu", "kafka"]),
    default="tansu",
    show_default=True,
    help="The local broker: the bundled Tansu, or Apache Kafka (needs Java 17+).",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Kafka only: nodes; with 3 or more, partition leaders are SIGKILLed and SIGSTOPped.",
)
@click.option(
    "--projectors",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Projector processes in one group; more than one project into a shard directory "
    "of an 8-partition topic, and members are killed, stopped and added during the run.",
)
@click.option(
    "--recoverers",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Recovery daemons in one group (their state on the recovery changelog topic).",
)
@click.option(
    "--state-in-kafka",
    "state_in_kafka",
    is_flag=True,
    hidden=True,
    help="Deprecated, does nothing: recovery state is always on the changelog topic.",
)
@click.option(
    "--no-shared-state",
    "no_shared_state",
    is_flag=True,
    help="No volume shared between members: each projector "
    "projects into a directory of its own, a checkpointer runs, agents open workflows from "
    "Kafka; the projection checked is each partition's freshest shard.",
)
@click.option("--parallel", default=2, show_default=True, type=click.IntRange(1, 16))
@click.option(
    "--two-deployments",
    is_flag=True,
    help="Run a second deployment on the same cluster at the same time (implies "
    "--no-shared-state for both: checkpointers and recovery state in Kafka), named by its "
    "step log alone; both are checked, and that they shared no state.",
)
@click.option(
    "--secure",
    is_flag=True,
    help="Kafka only: a secured cluster (SASL/SCRAM, ACLs); each deployment is a fleet made "
    "by `fleet create` and every process runs with its own role's credentials.",
)
@click.option(
    "--lake",
    metavar="CATALOG_DSN",
    default="",
    help="The projectors commit to this DuckLake (needs the [lake] extra; the bucket's key "
    "from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL), each with a state "
    "directory of its own (implies --no-shared-state); an analyst process reads it meanwhile.",
)
@click.option("--data-path", default="", metavar="URL", help="With --lake: its data path.")
@click.option(
    "--rebuild-lake",
    metavar="CATALOG_DSN",
    default="",
    help="With --lake (and needed by it): a fresh lake the log is rebuilt into at the end, "
    "to compare with the lake.",
)
@click.option(
    "--agent-skew",
    type=float,
    default=0.0,
    show_default=True,
    help="Seconds the agents' wall clock runs ahead (negative: behind) of the daemons'.",
)
def chaos(
    workflows: int,
    seed: int,
    duration: float,
    bootstrap: str | None,
    report_path: Path | None,
    workdir: Path | None,
    durable_broker: bool,
    engine: Literal["tansu", "kafka"],
    nodes: int,
    projectors: int,
    recoverers: int,
    state_in_kafka: bool,
    no_shared_state: bool,
    parallel: int,
    two_deployments: bool = False,
    secure: bool = False,
    agent_skew: float = 0.0,
    lake: str = "",
    data_path: str = "",
    rebuild_lake: str = "",
    break_mode: str | None = None,
) -> None:
    """Run example workflows under SIGKILLs at labelled crash points; check the invariants."""
    from stepledger_dev.chaos import report
    from stepledger_dev.chaos.harness import ChaosOptions, run_chaos

    if engine == "tansu" and nodes != 1:
        raise click.UsageError("--nodes needs --engine kafka")
    if secure and engine != "kafka":
        raise click.UsageError("--secure needs --engine kafka")
    if engine == "kafka" and (bootstrap or durable_broker):
        raise click.UsageError(
            "--engine kafka starts its own broker: drop --bootstrap and --durable-broker"
        )
    if bool(rebuild_lake) != bool(lake):
        raise click.UsageError(
            "--lake and --rebuild-lake go together: the lake is compared with a rebuild "
            "into the fresh one"
        )
    if lake and two_deployments:
        raise click.UsageError("--lake runs one deployment: drop --two-deployments")
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="stepledger-chaos-"))
    options = ChaosOptions(
        workflows=workflows,
        seed=seed,
        duration_s=duration,
        bootstrap=bootstrap or None,
        workdir=workdir,
        durable_broker=durable_broker,
        engine=engine,
        nodes=nodes,
        break_mode=break_mode,
        parallel=parallel,
        projectors=projectors,
        recoverers=recoverers,
        no_shared_state=no_shared_state or two_deployments or bool(lake),
        agent_skew_s=agent_skew,
        two_deployments=two_deployments,
        secure=secure,
        lake=lake,
        lake_data_path=data_path,
        rebuild_lake=rebuild_lake,
    )
    click.echo(f"chaos: {options.workflows} workflows, seed {options.seed}")
    from stepledger.daemon.process import sigterm_interrupts

    with sigterm_interrupts():  # a SIGTERM still stops every process the run started
        result = run_chaos(options, echo=click.echo)
    click.echo(report.table(result))
    if result.broker_faults:
        click.echo(f"broker faults: {'; '.join(result.broker_faults)}")
        click.echo(f"{result.acked_in_broker_faults} acknowledged event(s) written during them")
    if options.scaled:
        click.echo(f"members started: {result.members}")
        click.echo(f"step attempts decided by recovery daemons: {result.decided_by_daemons}")
        click.echo(f"partitions replayed from offset 0 (no state yet): {result.replays_from_zero}")
    if options.no_shared_state:
        click.echo(f"replayed from offset 0 by member: {result.projector_replays_by_member}")
    if options.lake:
        click.echo(f"the lake's offsets: {result.lake_offsets}")
        click.echo(f"consistent reads by the analyst: {result.analyst_cuts}")
    path = report_path or workdir / "chaos-report.json"
    options_dict = {k: str(v) for k, v in dataclasses.asdict(options).items()}
    report.write(path, report.as_json(result, options_dict))
    for violation in result.violations[:20]:
        click.echo(
            f"VIOLATION {violation.invariant}: {violation.workflow_id or '-'}: {violation.detail}",
            err=True,
        )
    click.echo(
        f"{len(result.violations)} violation(s) in {result.seconds:.0f}s; report: {path}; "
        f"replay with --seed {options.seed}"
    )
    if result.violations:
        raise SystemExit(1)


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(chaos)
