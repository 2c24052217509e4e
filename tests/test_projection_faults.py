"""Faults the projections must survive (issue 4), on real files: after each one the reads
answer exactly what a fresh rebuild answers, and the log is untouched."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from eventlog.log import EventLog
from eventlog.sessions.events import make_event
from eventlog.sessions.fold import Fold
from projections import Projector, Reader, files
from projections.testing import answers, checkpoint, current_file, diff, garbage_pages, truncate_half, zero_file

SIDS = ["s1", "s2", "s3", "c1", "gone", "zz"]


def populate(log: EventLog, rounds: int = 30) -> None:
    """A realistic profile: sessions with children, titles, messages (text, lists, CJK,
    tool calls), usage, reactions, a rewind, a deletion."""
    ev = [
        make_event("session.created", "s1", {"source": "cli", "cwd": "/w/x", "git_repo_root": "/w", "title": "First"}),
        make_event("session.created", "s2", {"source": "tg", "cwd": "/v", "user_id": 42}),
        make_event("session.created", "s3", {"started_at": 1.7e9}),
        make_event("session.created", "c1", {"parent_session_id": "s1"}),
        make_event("session.created", "gone", {"title": "Doomed"}),
        make_event("session.pinned", "s2", {}),
    ]
    log.append(ev)
    words = ["alpha", "beta", "gamma", "中文测试", "grep", "delta"]
    for i in range(rounds):
        sid = ["s1", "s2", "s3", "c1", "gone"][i % 5]
        batch = [
            make_event("message.appended", sid, {"role": "user", "content": f"{words[i % 6]} {i} Alpha beta"}),
            make_event("message.appended", sid, {
                "role": "assistant", "content": [{"type": "text", "text": f"{words[(i + 2) % 6]} reply {i}"}],
                "tool_calls": [{"id": f"c{i}", "function": {"name": "grep", "arguments": "{}"}}] if i % 3 else None,
                "token_count": i}),
            make_event("usage.recorded", sid, {"model": "m1", "provider": "p", "input_tokens": i,
                                               "output_tokens": 2 * i, "estimated_cost_usd": 0.001 * i}),
        ]
        seqs = log.append(batch)
        log.append([make_event("message.reaction_set", sid, {"message_id": seqs[0], "author": "ann", "emoji": "+1"})])
    first_s3 = next(e["seq"] for e in log.read() if e["session"] == "s3" and e["type"] == "message.appended")
    log.append([
        make_event("messages.rewound", "s3", {"message_id": first_s3 + 4}),
        make_event("session.titled", "s2", {"title": "Second", "source": "llm"}),
        make_event("session.archived", "c1", {}),
        make_event("session.deleted", "gone", {}),
        make_event("session.ended", "s1", {"reason": "done"}),
    ])


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    populate(log)
    directory = tmp_path / "profiles" / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
    fold = Fold()
    fold.apply_all(log.read())
    mids = list(range(1, log.head()[0] + 2))
    expected = answers(fold, SIDS, mids)
    yield log, directory, expected, mids
    log.close()


def check_reads(log: EventLog, directory: Path, expected: dict[Any, Any], mids: list[int],
                head_before: tuple[int, str] | None = None) -> Projector:
    """A new process's view: open (the cheap checks SessionStore.open runs), read everything,
    compare; the log is untouched. Damage the cheap checks miss is met by the reads, which
    repair and retry."""
    p = Projector(directory, log, "p")
    p.heal()
    reader = p.reader()
    got = answers(reader, SIDS, mids)
    assert got == expected, "\n".join(diff(expected, got)[:5])
    reader.close()
    if head_before is not None:
        assert log.head() == head_before
        assert log.verify().ok
    return p


def fresh_rebuild_answers(log: EventLog, tmp: Path, mids: list[int]) -> dict[Any, Any]:
    with Projector(tmp / "fresh", log, "p") as p:
        p.rebuild(out_path=tmp / "fresh.db")
    with Reader.open_file(tmp / "fresh.db") as r:
        return answers(r, SIDS, mids)


def test_projection_equals_fold_and_fresh_rebuild(setup: Any, tmp_path: Path) -> None:
    log, directory, expected, mids = setup
    assert fresh_rebuild_answers(log, tmp_path, mids) == expected
    check_reads(log, directory, expected, mids).close()


def test_files_modes_and_layout(setup: Any) -> None:
    log, directory, expected, mids = setup
    state = current_file(directory, "state")
    index = current_file(directory, "fts")
    assert os.path.islink(directory / "state.db") and os.path.islink(directory / "fts.db")
    for path in (state, index, directory / "projector.lock"):
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert directory.stat().st_mode & 0o777 == 0o700
    # SQLite resolves the symlink: the sidecars are named after the versioned file.
    db = sqlite3.connect(f"file:{directory / 'state.db'}?mode=ro", uri=True)
    assert db.execute("PRAGMA database_list").fetchone()[2] == str(state)
    db.close()


def replace_pointer_with_a_plain_copy(d: Path) -> None:
    shutil.copy(current_file(d), d / "copy")
    os.replace(d / "copy", d / "state.db")


FAULTS: dict[str, Callable[[Path], None]] = {
    "deleted": lambda d: os.unlink(current_file(d)),
    "pointer_deleted": lambda d: os.unlink(d / "state.db"),
    "zeroed": lambda d: zero_file(current_file(d)),
    "truncated": lambda d: truncate_half(current_file(d)),
    "garbage_pages": lambda d: None if garbage_pages(current_file(d), pages=4, seed=1) else None,
    "read_only": lambda d: os.chmod(current_file(d), 0o400),
    "plain_file_instead_of_pointer": replace_pointer_with_a_plain_copy,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_state_fault_is_detected_and_rebuilt(setup: Any, fault: str) -> None:
    log, directory, expected, mids = setup
    head = log.head()
    checkpoint(current_file(directory))
    before = files.read_pointer(directory / "state.db")
    FAULTS[fault](directory)
    with Projector(directory, log, "p") as p:
        h = p.health(full=True)
        assert h["state"]["status"] not in ("ok", "stale"), h
        assert h["ok"] is False
    p = check_reads(log, directory, expected, mids, head)
    after = files.read_pointer(directory / "state.db")
    assert after is not None and before is not None and after.gen > before.gen
    assert p.health(full=True)["ok"]
    p.close()


def test_state_fault_with_full_heal(setup: Any) -> None:
    log, directory, expected, mids = setup
    checkpoint(current_file(directory))
    garbage_pages(current_file(directory), pages=6, seed=7)
    with Projector(directory, log, "p") as p:
        h = p.heal(full=True)
        assert h["ok"], h
    check_reads(log, directory, expected, mids).close()


def fts_shadow(sql: str) -> Callable[[Path], None]:
    def fault(d: Path) -> None:
        db = sqlite3.connect(current_file(d, "fts"))
        db.execute("PRAGMA writable_schema = 1")
        db.execute(sql)
        db.commit()
        db.close()
    return fault


FTS_FAULTS = {
    "data_random": fts_shadow("UPDATE fts_data SET block = randomblob(length(block)) WHERE id > 10"),
    "data_deleted": fts_shadow("DELETE FROM fts_data WHERE id > 1"),
    "data_dropped": fts_shadow("DROP TABLE fts_data"),
    "idx_dropped": fts_shadow("DROP TABLE fts_idx"),
    "fts_file_zeroed": lambda d: zero_file(current_file(d, "fts")),
    "fts_file_deleted": lambda d: os.unlink(current_file(d, "fts")),
}


@pytest.mark.parametrize("fault", sorted(FTS_FAULTS))
def test_fts_fault_degrades_search_only_and_is_rebuilt_alone(setup: Any, fault: str) -> None:
    log, directory, expected, mids = setup
    head = log.head()
    checkpoint(current_file(directory, "fts"))
    state_before = files.read_pointer(directory / "state.db")
    fts_before = files.read_pointer(directory / "fts.db")
    FTS_FAULTS[fault](directory)
    p = Projector(directory, log, "p")
    h = p.health(full=True)
    assert h["fts"]["status"] not in ("ok", "stale") and h["fts"]["degraded"], h
    assert h["state"]["status"] == "ok"
    reader = p.reader()
    # Transcripts stay readable; search answers correctly (from a scan when the index fails,
    # which also starts a background repair of the index alone).
    assert reader.get_messages("s1") == expected["get_messages", "s1"]
    for word in ("alpha", "中文", "grep", "a"):
        found = reader.search(word, limit=None)
        assert [r["message_id"] for r in found["results"]] == expected["search", word]
    # Writes go on: a new message is readable while search is degraded.
    seq = log.append([make_event("message.appended", "s1", {"role": "user", "content": "alpha fresh"})])[0]
    assert p.advance(seq, wait=10).done
    assert reader.get_messages("s1", after=seq - 1)[0]["content"] == "alpha fresh"
    assert p.heal(full=True)["ok"]
    found = reader.search("alpha", limit=None)
    assert found["degraded"] is False
    assert [r["message_id"] for r in found["results"]] == [seq] + expected["search", "alpha"]
    assert files.read_pointer(directory / "state.db") == state_before
    after = files.read_pointer(directory / "fts.db")
    assert after is not None and fts_before is not None and after.gen > fts_before.gen
    reader.close()
    p.close()
    assert log.head()[0] == head[0] + 1 and log.verify().ok


def test_stale_wal_from_another_database_is_not_trusted(setup: Any, tmp_path: Path) -> None:
    log, directory, expected, mids = setup
    # Another log's projection, with its last transaction still in its -wal.
    other_log = EventLog.open(tmp_path / "other-log", durability="nosync", profile="p")
    populate(other_log, rounds=3)
    other_dir = tmp_path / "other"
    with Projector(other_dir, other_log, "p") as p:
        p.advance()
    other_state = current_file(other_dir)
    writer = sqlite3.connect(other_state)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("UPDATE sessions SET title = 'Other' WHERE id = 's1'")
    # A projector's transaction always moves its cursor: the WAL holds the other file's meta page
    # (SQLite may skip writing a row updated to the same value; then it would not).
    writer.execute("UPDATE meta SET value = value + 1 WHERE key = 'last_seq'")
    writer.commit()
    wal = Path(f"{other_state}-wal")
    assert wal.stat().st_size > 0
    target = current_file(directory)
    checkpoint(target)
    # Copied by another process: this one holds locks on that database (see DESIGN hazards).
    subprocess.run(["cp", str(wal), f"{target}-wal"], check=True)
    writer.close()
    for suffix in ("-shm",):
        try:
            os.unlink(f"{target}{suffix}")
        except FileNotFoundError:
            pass
    with Projector(directory, log, "p") as p:
        assert p.health()["state"]["status"] in ("foreign", "corrupt")
    check_reads(log, directory, expected, mids, log.head()).close()
    other_log.close()


def test_projection_from_another_profiles_log_is_rebuilt(setup: Any, tmp_path: Path) -> None:
    log, directory, expected, mids = setup
    other_log = EventLog.open(tmp_path / "b-log", durability="nosync", profile="b")
    populate(other_log, rounds=5)
    other_dir = tmp_path / "profiles" / "b"
    with Projector(other_dir, other_log, "b") as p:
        p.advance()
    # Profile p's pointers now name copies of profile b's files.
    for kind in ("state", "fts"):
        src = current_file(other_dir, kind)
        g = files.next_generation(directory, kind, files.read_pointer(directory / f"{kind}.db").schema)
        checkpoint(src)
        shutil.copy(src, g.path)
        files.swap_pointer(directory / f"{kind}.db", g)
    with Projector(directory, log, "p") as p:
        h = p.health()
        assert h["state"]["status"] == "foreign" and h["fts"]["status"] == "foreign", h
    check_reads(log, directory, expected, mids, log.head()).close()
    # ... and the same files opened against a different log (same profile name) are foreign too.
    with Projector(other_dir, log, "b") as p:
        assert p.health()["state"]["status"] == "foreign"
    other_log.close()


def test_projection_ahead_of_the_log_is_rebuilt(setup: Any, tmp_path: Path) -> None:
    log, directory, expected, mids = setup
    # A longer log's projection paired with a shorter copy of it: the cursor is past the head.
    short = EventLog.open(tmp_path / "short", durability="nosync", profile="p")
    short.append(list({k: e[k] for k in ("type", "session", "data", "v", "id")} for e in log.read(1, 10)))
    other = tmp_path / "short-proj"
    shutil.copytree(directory, other, symlinks=True)
    with Projector(other, short, "p") as p:
        assert p.health()["state"]["status"] in ("ahead", "foreign")
        p.heal()
        assert p.health()["ok"]
        fold = Fold()
        fold.apply_all(short.read())
        r = p.reader()
        assert answers(r, SIDS, mids) == answers(fold, SIDS, mids)
        r.close()
    short.close()


def test_reader_holding_a_transaction_across_a_swap(setup: Any) -> None:
    log, directory, expected, mids = setup
    held = sqlite3.connect(f"file:{directory / 'state.db'}?mode=ro", uri=True, isolation_level=None)
    held.execute("BEGIN")
    before = held.execute("SELECT count(*), max(id) FROM messages").fetchone()
    reader_p = Projector(directory, log, "p")
    reader = reader_p.reader()
    assert reader.get_session("s1") == expected["get_session", "s1"]
    old = files.read_pointer(directory / "state.db")
    with Projector(directory, log, "p") as p:
        log.append([make_event("message.appended", "s2", {"role": "user", "content": "after swap"})])
        p.rebuild("all")
        p.rebuild("all")  # two swaps
    # The generation the Reader holds stays; the one between, which nobody held, is gone.
    assert old is not None and old.path.exists()
    now = files.read_pointer(directory / "state.db")
    assert now is not None and [g.name for g in files.generations(directory, "state")] == [old.name, now.name]
    # The held transaction still reads its snapshot of the old file.
    assert held.execute("SELECT count(*), max(id) FROM messages").fetchone() == before
    held.execute("COMMIT")
    held.close()
    # The Reader notices the new generation and reads the new file; letting go of the old
    # one, the last holder deletes it.
    assert reader.get_messages("s2")[-1]["content"] == "after swap"
    assert reader.search("after swap")["results"][0]["snippet"].startswith("«after»")
    assert not any(Path(f"{old.path}{sfx}").exists() for sfx in ("", "-wal", "-shm")) and not files.lock_path(
        old).exists()
    reader.close()
    reader_p.close()


def test_replaced_generations_nobody_holds_are_deleted_at_once(setup: Any) -> None:
    log, directory, expected, mids = setup
    with Projector(directory, log, "p") as p:
        for _ in range(3):
            p.rebuild("all")
        # Only the current generations (and their lock files and WAL sidecars) are left.
        current = [files.read_pointer(directory / f"{k}.db") for k in ("state", "fts")]
        assert all(current)
        left = {(kind, gen) for kind, gen, _schema in files.generation_files(directory)}
        assert left == {(g.kind, g.gen) for g in current if g}
    check_reads(log, directory, expected, mids).close()


def test_hot_update_newer_schema_keeps_its_file_and_older_program_uses_its_own(setup: Any) -> None:
    log, directory, expected, mids = setup
    cur = files.read_pointer(directory / "state.db")
    assert cur is not None
    # A newer program version (schema cur+1) took over the canonical pointer.
    newer = directory / f"state.{cur.gen + 10}.v{cur.schema + 1}.db"
    checkpoint(cur.path)
    shutil.copy(cur.path, newer)
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {cur.schema + 1}")
    db.commit()
    db.close()
    files.swap_pointer(directory / "state.db", files.parse(newer))  # type: ignore[arg-type]
    p = check_reads(log, directory, expected, mids)
    # This (older) program did not touch the newer file; it built its own behind a private pointer.
    assert os.readlink(directory / "state.db") == newer.name
    assert os.path.islink(directory / f"state.v{cur.schema}.db")
    seq = log.append([make_event("message.appended", "s1", {"role": "user", "content": "still writing"})])[0]
    assert p.advance(seq, wait=10).done
    assert p.reader().get_messages("s1")[-1]["content"] == "still writing"
    p.close()


HOLD_SHARED = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_SH)
print("ready", flush=True)
sys.stdin.read()
"""


def test_an_older_versions_private_files_go_once_its_last_process_is_gone(setup: Any) -> None:
    """After a hot update the older version's private pointer and file stay while a process of
    that version is alive (it holds state.v<old>.lock shared) and are removed by the next open
    once it is gone (SIGKILLed here); the current projection is untouched."""
    import signal
    import sys

    log, directory, expected, mids = setup
    cur = files.read_pointer(directory / "state.db")
    assert cur is not None
    old_schema = cur.schema - 1
    old_file = directory / f"state.{cur.gen + 5}.v{old_schema}.db"
    checkpoint(cur.path)
    shutil.copy(cur.path, old_file)
    for suffix in ("-wal", "-shm"):
        Path(f"{old_file}{suffix}").write_bytes(b"")
    os.symlink(old_file.name, directory / f"state.v{old_schema}.db")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_SHARED, str(directory / f"state.v{old_schema}.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with Projector(directory, log, "p") as p:
            p.heal()
            assert p.collect_superseded() == []
        assert os.path.islink(directory / f"state.v{old_schema}.db") and old_file.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    with Projector(directory, log, "p") as p:
        p.heal()  # the next open collects them
    assert not os.path.lexists(directory / f"state.v{old_schema}.db")
    assert not any(Path(f"{old_file}{sfx}").exists() for sfx in ("", "-wal", "-shm"))
    assert files.read_pointer(directory / "state.db") == cur and cur.path.exists()
    check_reads(log, directory, expected, mids).close()


def test_a_running_program_keeps_its_own_schema_files(setup: Any) -> None:
    """A program never removes the private pointer of its own schema, nor a newer one's."""
    log, directory, expected, mids = setup
    cur = files.read_pointer(directory / "state.db")
    assert cur is not None
    os.symlink(cur.name, directory / f"state.v{cur.schema}.db")
    os.symlink(cur.name, directory / f"state.v{cur.schema + 1}.db")
    with Projector(directory, log, "p") as p:
        assert p.collect_superseded() == []
    assert os.path.islink(directory / f"state.v{cur.schema}.db")
    assert os.path.islink(directory / f"state.v{cur.schema + 1}.db")


def test_old_schema_file_is_rebuilt_into_a_new_generation(setup: Any) -> None:
    log, directory, expected, mids = setup
    cur = files.read_pointer(directory / "state.db")
    assert cur is not None
    older = directory / f"state.{cur.gen + 1}.v0.db"
    checkpoint(cur.path)
    shutil.copy(cur.path, older)
    files.swap_pointer(directory / "state.db", files.parse(older))  # type: ignore[arg-type]
    with Projector(directory, log, "p") as p:
        assert p.health()["state"]["status"] == "old_schema"
    check_reads(log, directory, expected, mids).close()
    g = files.read_pointer(directory / "state.db")
    assert g is not None and g.schema == cur.schema and g.gen > cur.gen + 1
    assert not older.exists()  # no process of that version holds state.v0.lock (else it stays)


def test_odd_stored_values_never_break_a_read(setup: Any) -> None:
    log, directory, expected, mids = setup
    db = sqlite3.connect(current_file(directory))
    db.execute("UPDATE sessions SET started_at = 'yesterday', last_activity_at = 1e30, "
               "message_count = 'many', model_config = '{broken', input_tokens = 'x' WHERE id = 's1'")
    db.execute("UPDATE sessions SET ended_at = -5 WHERE id = 's2'")
    db.execute("UPDATE messages SET timestamp = 'noon', content = X'00ff', tool_calls = '[' WHERE session_id = 's1'")
    db.execute("UPDATE reactions SET set_seq = 'x'")
    db.commit()
    db.close()
    with Projector(directory, log, "p") as p:
        r = p.reader()
        s1 = r.get_session("s1")
        assert s1 is not None and s1["started_at"] is None and s1["last_activity_at"] is None
        assert s1["message_count"] is None and s1["model_config"] is None and s1["input_tokens"] is None
        assert r.get_session("s2")["ended_at"] is None  # type: ignore[index]
        assert all(m["timestamp"] is None and m["content"] is None for m in r.get_messages("s1"))
        assert len(r.list_sessions(limit=None)) == len(expected["list_sessions", 1])
        r.stats()
        r.unseen_reactions("s2")
        r.search("alpha")
        assert any("'s1'" in w and "started_at" in w for w in r.warnings.lines)
        assert any("'s2'" in w and "ended_at" in w for w in r.warnings.lines)
        r.close()


def test_odd_values_in_the_log_are_shown_as_unknown_and_warned_naming_the_session(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Writers validate, but an import or an old log can hold values the read models cannot
    show (invariant 8): they are projected as unknown and each is warned about, naming the
    session, the field and the event; through the CLI that is a warning line on stderr."""
    events = [
        {"type": "session.created", "session": "odd", "data": {"started_at": "yesterday-ish"}},
        {"type": "message.appended", "session": "odd",
         "data": {"role": "user", "content": "hi", "timestamp": 1e30, "token_count": "many"}},
        {"type": "usage.recorded", "session": "odd", "data": {"input_tokens": "9", "estimated_cost_usd": -1}},
        {"type": "session.ended", "session": "odd", "data": {"ended_at": "noon"}},
        {"type": "session.created", "session": "fine", "data": {"started_at": 1700000000.0}},
        {"type": "message.appended", "session": "fine", "data": {"role": "user", "content": "ok", "timestamp": 5}},
    ]
    home = tmp_path / "home"
    directory = home / "profiles" / "p"
    with EventLog.open(directory / "log") as log:
        log.append(events)  # the raw log: no session-level validation
        with caplog.at_level("WARNING", logger="eventlog.projections"), Projector(directory, log, "p") as p:
            r = p.reader()
            session = r.get_session("odd")
            assert session is not None and session["started_at"] is None and session["ended_at"] is None
            (message,) = r.get_messages("odd")
            assert message["timestamp"] is None and message["token_count"] is None
            assert session["input_tokens"] == 0 and session["estimated_cost_usd"] is None
            r.close()
    warned = [rec.getMessage() for rec in caplog.records if "shown as unknown" in rec.getMessage()]
    for field, seq in (("started_at", 1), ("timestamp", 2), ("token_count", 2), ("input_tokens", 3),
                       ("estimated_cost_usd", 3), ("ended_at", 4)):
        assert any(w.startswith(f"session 'odd': {field} ") and f"at seq {seq} " in w for w in warned), (field, warned)
    assert not any("'fine'" in w for w in warned), warned
    # a store reading through the reference fold (read_model="fold") says the same
    caplog.clear()
    from eventlog.sessions.store import SessionStore

    with caplog.at_level("WARNING", logger="eventlog.sessions"), \
            SessionStore.open(home, "p", read_model="fold", follower=False) as store:
        session = store.get_session("odd")
        assert session is not None and session["started_at"] is None and session["ended_at"] is None
        assert store.get_messages("odd")[0]["timestamp"] is None
    folded = [rec.getMessage() for rec in caplog.records if "shown as unknown" in rec.getMessage()]
    assert sorted(folded) == sorted(warned), (folded, warned)
    # a one-shot command that projects them says so on stderr
    for name in os.listdir(directory):
        if name.startswith(("state.", "fts.")):
            os.unlink(directory / name)
    exe = Path(os.sys.executable).with_name("eventlog")
    done = subprocess.run([str(exe), "--home", str(home), "--profile", "p", "sessions", "show", "odd"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "warning: session 'odd': timestamp 1e+30" in done.stderr, done.stderr


def test_search_accepts_any_text(setup: Any) -> None:
    log, directory, expected, mids = setup
    fold = Fold()
    fold.apply_all(log.read())
    queries = ['"', "'", "(", ")", "alpha)", "(alpha", "AND", "alpha OR beta", "NOT", "NEAR(a b)", "*", "al*",
               "^alpha", "alpha:beta", "col:alpha", "{alpha}", "a+b", '"unbalanced', "\\", "%", "_", "' OR 1=1 --",
               "中文", "文测", "测试 alpha", "x" * 500, " ", "", "\0", "ALPHA", "ph", "a"]
    with Projector(directory, log, "p") as p:
        r = p.reader()
        for q in queries:
            got = r.search(q, limit=None)
            assert got["degraded"] is False
            assert [x["message_id"] for x in got["results"]] == [m["id"] for m in fold.search(q, limit=None)], q
        hit = r.search("alpha")["results"][0]
        assert "«" in hit["snippet"] and hit["session_id"] in ("s1", "s2", "s3", "c1")
        r.close()


def test_a_failed_search_repairs_the_index_in_the_background(setup: Any) -> None:
    log, directory, expected, mids = setup
    checkpoint(current_file(directory, "fts"))
    FTS_FAULTS["fts_file_zeroed"](directory)
    with Projector(directory, log, "p") as p:
        reader = p.reader()
        found = reader.search("alpha", limit=None)
        assert found["degraded"] is True
        assert [r["message_id"] for r in found["results"]] == expected["search", "alpha"]
        deadline = time.monotonic() + 10
        while reader.search("alpha")["degraded"]:
            assert time.monotonic() < deadline, "the index was not repaired"
            time.sleep(0.01)
        assert [r["message_id"] for r in reader.search("alpha", limit=None)["results"]] == expected["search", "alpha"]
        assert p.health(full=True)["ok"]
        reader.close()


def test_an_index_that_fails_beside_a_rebuild_leaves_state_db_in_and_search_degraded(
        setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full rebuild builds the index beside state.db (projections.concurrent_index). When that
    build fails, state.db is still swapped in and answers; search is degraded but exact, the
    failed index file is gone, and the next heal builds the index."""
    from projections import fts

    log, directory, expected, mids = setup
    original = fts.Bulk.finish

    def broken(self: Any) -> int:
        raise sqlite3.OperationalError("disk I/O error (injected)")

    monkeypatch.setattr(fts.Bulk, "finish", broken)
    state_before = files.read_pointer(directory / "state.db")
    with Projector(directory, log, "p") as p:
        p.rebuild("all")
        state_after = files.read_pointer(directory / "state.db")
        assert state_after is not None and state_before is not None and state_after.gen > state_before.gen
        assert files.read_pointer(directory / "fts.db") is None  # the old index was dropped, no new one
        assert not list(directory.glob("fts.*.db"))  # the failed build's file is deleted
        with p.reader() as reader:
            assert answers(reader, SIDS, mids) == expected  # search answers exactly, from a scan
            assert reader.search("alpha")["degraded"] is True
        monkeypatch.setattr(fts.Bulk, "finish", original)
        assert p.heal(full=True)["ok"]
        with p.reader() as reader:
            assert reader.search("alpha")["degraded"] is False
            assert answers(reader, SIDS, mids) == expected


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="per-thread nice values are Linux's")
def test_the_index_thread_of_a_rebuild_runs_at_a_lower_priority(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine the state file (what list_sessions waits for) keeps its core: the
    thread that builds the index beside it is reniced, and the process itself is not."""
    from projections import fts

    log, directory, expected, mids = setup
    seen: list[int] = []
    original = fts.Bulk.finish

    def finish(self: Any) -> int:
        import threading

        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return original(self)

    monkeypatch.setattr(fts.Bulk, "finish", finish)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with Projector(directory, log, "p") as p:
        p.rebuild("all")
    assert seen == [min(19, base + 10)]
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # this (the building) thread is as it was


def test_values_of_the_wrong_type_are_warned_about_as_the_times_are(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Text and JSON fields of the wrong type read as unknown as before, but silently: only
    times and counts were warned about (found by an outside audit). Both read models now name
    each, with the session, the field and the event."""
    events = [
        {"type": "session.created", "session": "odd", "data": {"title": 5, "model_config": "notobj", "cwd": 7}},
        {"type": "message.appended", "session": "odd", "v": 2,
         "data": {"role": "user", "content": 12, "display_metadata": [1], "tool_calls": "str", "tool_name": ["x"]}},
        {"type": "session.meta_updated", "session": "odd", "data": {"git_branch": 3, "model_config": [1]}},
        {"type": "session.titled", "session": "odd", "data": {"title": {"a": 1}, "source": "user"}},
        {"type": "session.created", "session": "fine", "data": {"title": "ok", "model_config": {"t": 1}}},
        {"type": "message.appended", "session": "fine", "v": 2, "data": {"role": "user", "content": [{"type": "text"}]}},
    ]
    home = tmp_path / "home"
    directory = home / "profiles" / "p"
    with EventLog.open(directory / "log") as log:
        log.append(events)
        with caplog.at_level("WARNING", logger="eventlog.projections"), Projector(directory, log, "p") as p:
            r = p.reader()
            session = r.get_session("odd")
            assert session is not None and session["title"] is None and session["cwd"] is None
            (message,) = r.get_messages("odd")
            assert message["content"] is None and message["tool_calls"] is None and message["tool_name"] is None
            r.close()
    warned = [rec.getMessage() for rec in caplog.records if "shown as unknown" in rec.getMessage()]
    for field, seq in (("title", 1), ("model_config", 1), ("cwd", 1), ("content", 2), ("display_metadata", 2),
                       ("tool_calls", 2), ("tool_name", 2), ("git_branch", 3), ("model_config", 3), ("title", 4)):
        assert any(w.startswith(f"session 'odd': {field} ") and f"at seq {seq} " in w for w in warned), (field, warned)
    assert not any("'fine'" in w for w in warned), warned
    caplog.clear()
    from eventlog.sessions.store import SessionStore

    with caplog.at_level("WARNING", logger="eventlog.sessions"), \
            SessionStore.open(home, "p", read_model="fold", follower=False) as store:
        assert store.get_session("odd")["title"] is None
    folded = [rec.getMessage() for rec in caplog.records if "shown as unknown" in rec.getMessage()]
    assert sorted(folded) == sorted(warned), (folded, warned)
