"""Context: the string that carries a worker's address, task and secret (SPEC §1.9)."""

from __future__ import annotations

import pytest

from bellis import Context

ODD_IDS = ["t:1", "a=b", "50%", "with space", "ünïcødé/段", "::==%%", "%3A", ""]


@pytest.mark.parametrize("task_id", ODD_IDS)
def test_round_trip_of_any_task_id(task_id: str) -> None:
    ctx = Context(hostname="h", port=5, task_id=task_id, worker_id=3)
    back = Context.from_env_string(ctx.to_env())
    assert back["task_id"] == task_id
    assert dict(back.items()) == dict(ctx.items())


def test_encoding_is_daisy_compatible_and_deterministic() -> None:
    ctx = Context(task_id="t:1", hostname="h", port=5, logdir="")
    env = ctx.to_env()
    assert "task_id=t%3A1" in env and "logdir=" in env
    assert env == "hostname=h:logdir=:port=5:task_id=t%3A1"
    assert Context(port=5, hostname="h", logdir="", task_id="t:1").to_env() == env


def test_values_are_strings_and_logdir_is_added() -> None:
    ctx = Context(port=5)
    assert ctx["port"] == "5"
    assert "logdir" in ctx
    assert sorted(ctx) == ["logdir", "port"]
    assert ctx.get("missing", "d") == "d"
    copy = ctx.copy()
    copy["port"] = 6
    assert ctx["port"] == "5" and copy["port"] == "6"
    del copy["port"]
    assert "port" not in copy and len(copy) == 1


def test_decoding_accepts_lower_hex_and_keeps_unknown_escapes() -> None:
    ctx = Context.from_env_string("task_id=a%3ab%3db%25:x=%zz:::")
    assert ctx["task_id"] == "a:b=b%"
    assert ctx["x"] == "%zz"
    assert len(ctx) == 2


def test_token_without_equals_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid context token"):
        Context.from_env_string("hostname=h:oops")


def test_from_env_reads_bellis_then_daisy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BELLIS_CONTEXT", raising=False)
    monkeypatch.delenv("DAISY_CONTEXT", raising=False)
    with pytest.raises(KeyError, match="DAISY_CONTEXT not found"):
        Context.from_env()
    monkeypatch.setenv("DAISY_CONTEXT", "task_id=d")
    assert Context.from_env()["task_id"] == "d"
    monkeypatch.setenv("BELLIS_CONTEXT", "task_id=b")
    assert Context.from_env()["task_id"] == "b"
    assert Context.ENV_VARIABLE == "DAISY_CONTEXT"
