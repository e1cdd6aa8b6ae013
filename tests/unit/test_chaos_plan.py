"""The chaos plan on a Kafka cluster: broker kills are planned only where they can be survived."""

from __future__ import annotations

import json

from click.testing import CliRunner

from stepledger.cli import cli
from stepledger_dev.chaos.plan import CLUSTER_POINTS, CrashPoint, make_plan


def test_broker_kills_add_the_cluster_points_and_leave_the_rest_of_the_plan() -> None:
    plain = make_plan(20, 3, steps=4, max_attempts=3, broker_restarts=False)
    killing = make_plan(20, 3, steps=4, max_attempts=3, broker_restarts=False, broker_kills=True)
    assert not {f.point for f in plain.infra} & set(CLUSTER_POINTS)
    assert killing.workflows == plain.workflows
    kills = [f for f in killing.infra if f.point in CLUSTER_POINTS]
    assert sorted((f.point, f.round) for f in kills) == [
        (CrashPoint.BROKER_LEADER_KILL, 0),
        (CrashPoint.BROKER_LEADER_KILL, 1),
        (CrashPoint.BROKER_STOP, 0),
        (CrashPoint.BROKER_STOP, 1),
    ]
    assert [f for f in killing.infra if f not in kills] == list(plain.infra)


def test_chaos_refuses_nodes_without_kafka_and_kafka_with_an_external_broker() -> None:
    runner = CliRunner()
    nodes = runner.invoke(cli, ["chaos", "--nodes", "3"], env={"STEPLEDGER_BOOTSTRAP": ""})
    assert nodes.exit_code == 2 and "--nodes needs --engine kafka" in nodes.output
    external = runner.invoke(cli, ["chaos", "--engine", "kafka", "--bootstrap", "127.0.0.1:1"])
    assert external.exit_code == 2 and "starts its own broker" in external.output


def test_a_share_of_workflows_is_resumed_wording_its_free_text_otherwise() -> None:
    plan = make_plan(200, 7, steps=4, max_attempts=3, broker_restarts=False)
    reworded = [w for w in plan.workflows if w.reword]
    assert len(reworded) == 20 and len(plan.workflows) == 200
    for workflow in reworded:
        kill, resume = workflow.kills
        assert kill is not None and kill.step in (1, 3) and resume is None  # charge or email
        assert workflow.label is CrashPoint.REWORDED_RESUME


def test_the_report_stars_a_lake_catalogs_password() -> None:
    from stepledger_dev.chaos import report
    from stepledger_dev.chaos.harness import RunResult

    plan = make_plan(3, 7, steps=2, max_attempts=3, broker_restarts=False)
    result = RunResult(plan=plan, violations=[], status={})
    options = {
        "lake": "postgres:dbname=lake host=127.0.0.1 user=writer password=s3cret-pw",
        "rebuild_lake": "postgres://writer:s3cret-pw@127.0.0.1:5432/fresh",
        "seed": 7,
    }
    shown = report.as_json(result, options)
    assert "s3cret-pw" not in json.dumps(shown)
    assert shown["options"]["lake"].endswith("password=***") and shown["options"]["seed"] == 7
    assert shown["options"]["rebuild_lake"] == "postgres://writer:***@127.0.0.1:5432/fresh"
