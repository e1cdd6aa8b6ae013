"""The CLI's error boundary: a client refusing its settings is one line; a defect is not hidden."""

from __future__ import annotations

import click
import pytest
from confluent_kafka import KafkaError, KafkaException

from stepledger.cli._common import run_guarded


def _group(error: BaseException) -> click.Group:
    @click.group()
    def cli() -> None:
        """A CLI with one failing command."""

    @cli.command()
    def fail() -> None:
        raise error

    return cli


def test_a_client_refusing_its_settings_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = KafkaException(KafkaError(KafkaError._INVALID_ARG, "No such configuration: bogus"))
    monkeypatch.setattr("sys.argv", ["stepledger", "fail"])
    assert run_guarded(_group(refused)) == 1
    assert capsys.readouterr().err == "Error: Kafka client: No such configuration: bogus\n"


def test_any_other_exception_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["stepledger", "fail"])
    with pytest.raises(RuntimeError, match="a defect"):
        run_guarded(_group(RuntimeError("a defect")))
