"""Batch decoding gives exactly what decoding value by value gives, poison included."""

from __future__ import annotations

import pytest

from stepledger.codec import SINGLE_OBJECT_MAGIC, Codec
from stepledger.domain import events as ev
from stepledger.errors import CodecError, EventValidationError, UnknownSchemaError
from tests.unit.projector_logs import random_log

CODEC = Codec()


def invalid_value() -> bytes:
    good = random_log(seed=1, workflows=1)[0]
    body = ev.WorkflowStarted.model_construct(name="", attempt=0, read_only=False, max_attempts=1)
    return CODEC.encode(good.model_copy(update={"body": body}))


def outcome(value: bytes | None) -> object:
    try:
        return CODEC.decode(value)
    except (CodecError, EventValidationError) as exc:
        return (type(exc), exc.message)


def as_outcome(result: object) -> object:
    if isinstance(result, CodecError | EventValidationError):
        return (type(result), result.message)
    return result


@pytest.mark.parametrize("with_poison", [False, True])
def test_decode_many_equals_decode_value_by_value(with_poison: bool) -> None:
    values: list[bytes | None] = [CODEC.encode(e) for e in random_log(seed=2, workflows=10)]
    if with_poison:
        good = values[0] or b""
        values[3:3] = [
            None,
            b"\x00\x01",
            SINGLE_OBJECT_MAGIC + b"\x01" * 8 + good[10:],
            good[:10] + b"\xff\xff",
            invalid_value(),
        ]
    decoded = CODEC.decode_many(values)
    assert [as_outcome(r) for r in decoded] == [outcome(v) for v in values]
    kinds = {type(r) for r in decoded}
    if with_poison:
        assert {CodecError, UnknownSchemaError, EventValidationError} <= kinds
    else:
        assert kinds == {ev.Event}


def test_decode_many_of_nothing_is_nothing() -> None:
    assert CODEC.decode_many([]) == []
