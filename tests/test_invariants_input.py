"""Invariant 8 of DESIGN.md at the readers, written against a mutation no other test caught (the
mutation audit): a stored cost that is not a finite number (SQLite keeps an infinity; an edit,
an import or another program's row can leave one) is shown as unknown and warned about, naming
the session, like every other odd stored value — never handed on as inf or nan."""
from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from eventlog.sessions.store import SessionStore


@pytest.mark.parametrize("stored", ["9e999", "-9e999"])
def test_a_stored_cost_that_is_not_finite_reads_as_unknown_and_is_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, stored: str) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        store.create_session("s1")
        store.record_usage("s1", model="m", input_tokens=10, estimated_cost_usd=0.25)
        store.sync()
    state = (tmp_path / "profiles" / "p" / "state.db").resolve()
    conn = sqlite3.connect(state)
    try:
        conn.execute(f"UPDATE sessions SET estimated_cost_usd = {stored} WHERE id = 's1'")
        conn.commit()
        assert math.isinf(conn.execute("SELECT estimated_cost_usd FROM sessions").fetchone()[0])
    finally:
        conn.close()
    with caplog.at_level("WARNING"), SessionStore.open(tmp_path, "p", follower=False) as store:
        session = store.get_session("s1")
        assert session is not None and session["estimated_cost_usd"] is None
        assert session["input_tokens"] == 10
        store.stats()
    warned = [r.getMessage() for r in caplog.records if "estimated_cost_usd" in r.getMessage()]
    assert warned and all("'s1'" in w for w in warned), warned
