"""Retention and erase at scale (outside audit, helper-87).

Choosing what to erase costs work linear in the sessions: retention collected its lineages into a
list, testing each new one with ``in`` against everything collected before, and a lineage's
descendants were collected the same way, quadratic (a dry run over 100,000 one-session lineages
took 303 s, nearly all of it in those tests). Counted here as comparisons of session ids, not timed.

An erase of more events than one ``log.erased`` record can name within the event size limit (a
session of ~215,000 events, a retention over 100,000 small sessions) is recorded in several
records; it was refused as too large, naming an internal field, and could never run. Shown here
with the limit scaled down."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from eventlog.sessions.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))

N = 1500


class Counted(str):
    """A session id that counts the equality tests made on it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _counted(ids: Any) -> list[Counted]:
    return [Counted(i) for i in ids]


def test_retention_picks_many_lineages_with_linear_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SessionStore.open(tmp_path, follower=False) as store:
        store.log.append([{"type": "session.created", "session": f"s{i:05d}", "data": {"source": "cli"}}
                          for i in range(N)])
        lineage = SessionStore._lineage_in_log
        monkeypatch.setattr(SessionStore, "_lineage_in_log",
                            lambda self, sid, children=None: _counted(lineage(self, sid, children)))
        Counted.compared = 0
        picked = store.retention(0, dry_run=True)["sessions"]
        assert sorted(picked) == [f"s{i:05d}" for i in range(N)]
        assert Counted.compared < 10 * N  # it was N * N / 2 (1,124,250 here)


def test_a_long_lineage_is_collected_with_linear_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of continuations (each session the parent of the next), as compression makes."""
    with SessionStore.open(tmp_path, follower=False) as store:
        store.log.append([{"type": "session.created", "session": "root", "data": {"source": "cli"}}]
                         + [{"type": "session.created", "session": f"c{i:05d}",
                             "data": {"source": "cli", "parent_session_id": f"c{i - 1:05d}" if i else "root"}}
                            for i in range(N)])
        scan = SessionStore._scan_lineages

        def counted_scan(self: SessionStore, cutoff: float | None = None) -> Any:
            children, *rest = scan(self, cutoff)
            return {p: _counted(c) for p, c in children.items()}, *rest

        monkeypatch.setattr(SessionStore, "_scan_lineages", counted_scan)
        Counted.compared = 0
        lineage = store._lineage_in_log("root")
        assert lineage == ["root"] + [f"c{i:05d}" for i in range(N)]
        assert Counted.compared < 10 * N  # it was N * N / 2


LIMIT = 64 * 1024  # the event size limit, scaled down: the record then names ~700 events


def _records(store: SessionStore) -> list[dict[str, Any]]:
    return [env for env in store.log.read() if env["type"] == "log.erased"]


def test_a_session_with_more_events_than_one_record_can_name_is_erased(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from test_erase import MARKER, traces  # (beside this file)

    from eventlog.log import codec

    monkeypatch.setattr(codec, "MAX_EVENT_BYTES", LIMIT)
    with SessionStore.open(tmp_path, follower=False) as store:
        sid = store.create_session(source="cli")
        for k in range(4):
            store.append_messages(sid, [{"role": "user", "content": f"{MARKER} {k} {i}"} for i in range(500)])
        keep = store.create_session(source="cli")
        store.append_message(keep, "user", "stays")
        out = store.erase_session(sid, "asked")  # it was: EventTooLargeError naming events[0].data
        assert out["events"] == 2001 and out["sessions"] == [sid]
        records = _records(store)
        assert len(records) >= 3 and sum(len(r["data"]["erased"]) for r in records) == 2001
        assert store.log.verify().ok and store.log.verify().erased == 2001
        assert store.get_session(sid) is None and [m["content"] for m in store.get_messages(keep)] == ["stays"]
        assert store.erase_session(sid, "again")["events"] == 0
    assert traces(tmp_path) == []


def test_retention_over_more_events_than_one_record_can_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eventlog.log import codec

    monkeypatch.setattr(codec, "MAX_EVENT_BYTES", LIMIT)
    with SessionStore.open(tmp_path, follower=False) as store:
        store.log.append([e for i in range(600) for e in (
            {"type": "session.created", "session": f"s{i:04d}", "data": {"source": "cli"}},
            {"type": "message.appended", "session": f"s{i:04d}", "v": 2, "data": {"role": "user", "content": "x"}})])
        out = store.retention(0)  # it was: EventTooLargeError naming events[0].data
        assert len(out["sessions"]) == 600 and out["erased_events"] == 1200
        assert len(_records(store)) >= 2 and store.log.verify().erased == 1200
        assert store.list_sessions(limit=None) == []


def test_an_erase_holds_what_it_needs_of_each_event_not_the_event(tmp_path: Path) -> None:
    """The memory an erase takes grows with the events it erases, not with their words: it held
    every envelope whole, twice (the streams it read, then the events it stubs), so a session of
    200,000 messages took 2 GB to erase. Counted as the peak of Python's allocations."""
    import tracemalloc

    words = 8000
    with SessionStore.open(tmp_path, follower=False) as store:
        sid = store.create_session(source="cli")
        for k in range(2):
            store.append_messages(sid, [{"role": "user", "content": f"{k} {i} " + "x" * words} for i in range(250)])
        store.sync()
        store.get_messages(sid, limit=1)  # the projections hold every event: the erase alone is measured
        tracemalloc.start()
        try:
            assert store.erase_session(sid, "asked")["events"] == 501
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 500 * words / 2  # it was ~3x the words (12 MB here); now ~2 KB an event


def test_a_hermes_conversation_with_more_events_than_one_record_can_name_is_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hermes' delete erases in the facade's engine: the same limit, the same cure (the record was
    refused after the delete committed, and again at each process's first write, which finishes
    the erases due)."""
    from test_erase import MARKER, traces  # (beside this file)

    from eventlog.adapters.hermes.db import SessionDB
    from eventlog.log import EventLog, codec

    monkeypatch.setattr(codec, "MAX_EVENT_BYTES", 32 * 1024)
    db = SessionDB(db_path=tmp_path / "state.db")
    try:
        db.create_session("conv", source="cli")
        db.replace_messages("conv", [{"role": "user", "content": f"{MARKER} {i}"} for i in range(150)])
        for i in range(700):
            db.append_message("conv", "assistant", content=f"{MARKER} reply {i}")
        db.create_session("other", source="cli")
        db.append_message("other", "user", content="stays")
        assert db.delete_session("conv")  # it was: EventTooLargeError naming events[0].data
        assert db.get_session("conv") is None and [m["content"] for m in db.get_messages("other")] == ["stays"]
    finally:
        db.close()
    with EventLog.open(tmp_path / "state.db.eventlog" / "profiles" / "default" / "log") as log:
        records = [env for env in log.read() if env["type"] == "log.erased"]
        assert len(records) >= 2 and records[-1]["data"]["sessions"] == ["conv"]
        assert all(r["data"]["sessions"] == [] for r in records[:-1])
        result = log.verify()
        assert result.ok and result.erased == sum(len(r["data"]["erased"]) for r in records)
    assert traces(tmp_path) == []


@pytest.mark.postgres
def test_retention_over_more_events_than_one_record_can_name_on_postgresql(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str, pg_profile: str) -> None:
    from eventlog.log import codec

    monkeypatch.setattr(codec, "MAX_EVENT_BYTES", LIMIT)
    with SessionStore.open(tmp_path, pg_profile, log=pg_url, follower=False) as store:
        store.log.append([e for i in range(600) for e in (
            {"type": "session.created", "session": f"s{i:04d}", "data": {"source": "cli"}},
            {"type": "message.appended", "session": f"s{i:04d}", "v": 2, "data": {"role": "user", "content": "x"}})])
        out = store.retention(0)
        assert len(out["sessions"]) == 600 and out["erased_events"] == 1200
        assert len(_records(store)) >= 2 and store.log.verify().erased == 1200
        assert store.list_sessions(limit=None) == []


def test_an_erase_killed_between_its_records_is_finished_by_the_next_retention(tmp_path: Path) -> None:
    """An erase of more events than one record names commits several records, the oldest events
    first. A process killed after the first leaves the session's newest events live while the
    read models already hide it (the record names it): no list shows it, and retention, which
    picks what the read models list and the deleted sessions, left its words in the log for
    good. The next retention finishes such an erase, whatever the session's age."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import os, sys
        from eventlog.log import codec
        from eventlog.log.lmdb import EventLog
        from eventlog.sessions.store import SessionStore
        codec.MAX_EVENT_BYTES = {LIMIT}
        with SessionStore.open({str(tmp_path)!r}, follower=False) as store:
            sid = store.create_session(id="long", source="cli")
            store.append_messages(sid, [{{"role": "user", "content": f"words {{i}}"}} for i in range(1500)])
            store.create_session(id="kept", source="cli")
            erase = EventLog.erase

            def erase_once_then_die(self, *args, **kwargs):
                erase(self, *args, **kwargs)
                os._exit(9)  # killed between the records

            EventLog.erase = erase_once_then_die
            store.erase_session(sid, "asked")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr
    with SessionStore.open(tmp_path, follower=False) as store:
        live = [e for e in store.log.read_session("long") if not e.get("erased")]
        assert live and store.get_session("long") is None  # hidden, its newest words still there
        out = store.retention(3650 * 86400)
        assert out["sessions"] == ["long"]
        assert [e for e in store.log.read_session("long") if not e.get("erased")] == []
        assert [s["id"] for s in store.list_sessions(limit=None)] == ["kept"]
        assert store.log.verify().ok
        assert store.retention(3650 * 86400)["sessions"] == []


def test_an_id_used_again_after_its_erase_is_not_taken_for_an_unfinished_erase(tmp_path: Path) -> None:
    """Hermes may create a session under the id of one it deleted (erased): the new session's
    events come after the erase record that names the id. They are a new session's, not the
    remains of an erase stopped part-way, and retention leaves them while they are in use."""
    from eventlog.adapters.hermes.db import SessionDB

    db = SessionDB(db_path=tmp_path / "state.db")
    try:
        db.create_session("a", source="cli")
        db.append_message("a", "user", content="old words")
        assert db.delete_session("a")
        db.create_session("a", source="cli")
        db.append_message("a", "user", content="new words")
    finally:
        db.close()
    with SessionStore.open(tmp_path / "state.db.eventlog", follower=False) as store:
        assert store.retention(3650 * 86400, dry_run=True)["sessions"] == []
