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
