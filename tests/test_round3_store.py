"""Round-3 outside audit (helper-61) of SessionStore as a library embeds it: open options on a
profile already open in the process, a closed handle beside open ones, bad arguments to
read_model, extension validators that fail in their own way -- and a hypothesis state machine
comparing paged reads, extension read models, reopen and rebuild with a plain model."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import ClosedError, ValidationError
from eventlog.sessions.extensions import EventType, Extension, ReadModel
from eventlog.sessions.store import SessionStore


def _apply_tally(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
    if env.get("type") == "tally.counted":
        conn.execute("INSERT INTO tally_counts (seq, stream, n) VALUES (?, ?, ?)",
                     (env["seq"], env["session"], env["data"]["n"]))


def _check_count(data: dict[str, Any]) -> dict[str, Any]:
    return {"n": int(data["n"])}  # a KeyError / TypeError / ValueError on data it does not expect


TALLY = Extension("tally", event_types=[EventType("tally.counted", 1, validate=_check_count)],
                  read_models=[ReadModel("tally", 1, ["CREATE TABLE tally_counts (seq INTEGER PRIMARY KEY, "
                                                      "stream TEXT, n INTEGER)"], _apply_tally)])


@pytest.mark.parametrize("option", [{"lock_timeout": "x"}, {"batch_size": "x"}, {"batch_size": 0},
                                    {"check": 1}, {"durability": "bogus"}, {"map_size": -1}])
def test_an_open_of_a_profile_already_open_refuses_the_bad_options_a_first_open_refuses(
        tmp_path: Path, option: dict[str, Any]) -> None:
    name = next(iter(option))
    with pytest.raises(ValidationError) as first:
        SessionStore.open(tmp_path, "fresh", follower=False, **option)
    assert first.value.field == name
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        with pytest.raises(ValidationError) as again:
            SessionStore.open(tmp_path, "p", follower=False, **option)
        assert again.value.field == name
        store.create_session(source="cli")  # the open handle is untouched


def test_a_closed_handle_refuses_erase_mark_while_another_handle_is_open(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as kept:
        closed = SessionStore.open(tmp_path, "p", follower=False)
        closed.close()
        with pytest.raises(ClosedError):
            closed.erase_mark()
        assert kept.erase_mark() == 0


@pytest.mark.parametrize("wait", ["x", None, True, float("nan"), -1])
def test_read_model_refuses_a_wait_that_is_not_seconds(tmp_path: Path, wait: Any) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[TALLY], follower=False) as store:
        with pytest.raises(ValidationError) as info:
            with store.read_model("tally", wait=wait):
                pass
        assert info.value.field == "wait"


@pytest.mark.parametrize("data", [{}, {"n": "many"}, {"n": [1]}])
def test_a_validator_failing_in_its_own_way_is_a_validation_error_naming_the_event(
        tmp_path: Path, data: dict[str, Any]) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[TALLY], follower=False) as store:
        good = {"type": "tally.counted", "session": "t1", "data": {"n": 1}}
        head = store.log.head()
        for call in (store.check_events, store.append_events):
            with pytest.raises(ValidationError) as info:
                call([good, {"type": "tally.counted", "session": "t1", "data": data}])
            assert info.value.field == "events[1].data"
            assert "tally.counted" in info.value.problem
        assert store.log.head() == head
