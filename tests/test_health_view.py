"""A projection's cursor judged against the log: a cursor past the head this process read is
"ahead" (to be rebuilt) only when the log's head, read again, is still behind it — between
the two reads another process may append and apply (4 writer processes found it: a writer
rebuilt the index while every file was healthy)."""
from __future__ import annotations

from pathlib import Path

from eventlog.log.memory import MemoryLog
from projections.health import LogView, judge_meta


def meta(log: MemoryLog, seq: int) -> dict[str, object]:
    return {"kind": "fts", "profile": "p", "last_seq": seq, "last_hash": log.get(seq)["hash"],  # type: ignore[index]
            "log_id": log.get(1)["hash"]}  # type: ignore[index]


def test_a_cursor_past_an_old_view_of_the_head_is_not_ahead(tmp_path: Path) -> None:
    log = MemoryLog()
    log.append([{"type": "test.event", "session": "s", "data": {"n": i}} for i in range(5)])
    view = LogView.of(log)  # head 5, then another process appends 3 and applies them
    log.append([{"type": "test.event", "session": "s", "data": {"n": i}} for i in range(3)])
    assert judge_meta(meta(log, 8), "fts", "p", view) == ("ok", "up to date")
    assert judge_meta(meta(log, 7), "fts", "p", view)[0] == "stale"
    changed = dict(meta(log, 7), last_hash="ab" * 32)
    assert judge_meta(changed, "fts", "p", view)[0] == "foreign"


def test_a_cursor_past_the_head_read_again_is_ahead(tmp_path: Path) -> None:
    log = MemoryLog()
    log.append([{"type": "test.event", "session": "s", "data": {"n": i}} for i in range(8)])
    m = meta(log, 8)
    short = MemoryLog()
    short.append([{"type": "test.event", "session": "s", "data": {"n": i}} for i in range(5)])
    view = LogView.of(short)
    status, detail = judge_meta(dict(m, log_id=short.get(1)["hash"]), "fts", "p", view)  # type: ignore[index]
    assert status == "ahead" and "log head is 5" in detail


def test_an_index_caught_up_between_the_two_reads_of_a_health_check_is_not_ahead(
        tmp_path: Path, monkeypatch: object) -> None:
    """``health()`` reads state.db's cursor, then the index's, without the lease: another
    process may catch both up in between (4 writer processes found it — the index was taken
    for "ahead" of state.db, search degraded and the index rebuilt). The state cursor is read
    again before the index is called ahead."""
    import pytest

    from eventlog.sessions.events import make_event
    from projections import Projector, heal

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    log = MemoryLog(profile="p")
    log.append([make_event("session.created", "s", {})])
    directory = tmp_path / "p"
    with Projector(directory, log, "p") as other, Projector(directory, log, "p") as p:
        p.advance()
        log.append([make_event("message.appended", "s", {"role": "user", "content": f"m{i}"}) for i in range(3)])
        real = heal.inspect
        calls = {"fts": 0}

        def inspect(pointer: Path, kind: str, **kw: object) -> dict[str, object]:
            if kind == "fts":
                calls["fts"] += 1
                if calls["fts"] == 1:
                    other.advance()  # another process catches up both files between the two reads
            return real(pointer, kind, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(heal, "inspect", inspect)
        h = p.health(full=False)
        assert h["fts"]["status"] == "ok" and not h["fts"]["degraded"], h["fts"]
        assert p.site.fts_fault is None  # nothing learnt that a later heal would "repair"
