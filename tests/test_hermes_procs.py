"""The Hermes facade under several threads and processes at once: a handle closed while another
thread writes on it, raw readers across rebuilds, a frozen or killed writer. Real processes, real
signals (an outside audit's findings, helper-53)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from eventlog.adapters.hermes import SessionDB, engine
from tests.fixtures_hermes import CURRENT_SCHEMA

ROOT = Path(__file__).resolve().parent.parent


def run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


_CLOSE_WHILE_WRITING = """
    import random, sys, threading, time
    from eventlog.adapters.hermes import SessionDB
    path, rounds = sys.argv[1], int(sys.argv[2])
    random.seed(5)
    acked, errors = [], set()
    for n in range(rounds):
        db = SessionDB(db_path=path)
        db.create_session(f"s{n}", "cli")
        stop = False
        def writer(k):
            i = 0
            while not stop:
                try:
                    acked.append((f"s{n}", db.append_message(f"s{n}", "user", f"m{n}.{k}.{i}"), f"m{n}.{k}.{i}"))
                except Exception as e:
                    errors.add(f"{type(e).__name__}: {e}")
                    return
                i += 1
        threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        time.sleep(random.uniform(0.001, 0.02))
        db.close()  # another thread's write is under way
        stop = True
        for t in threads:
            t.join()
    print(sorted(errors))
    db = SessionDB(db_path=path)
    for sid, mid, content in acked:
        assert {m["id"]: m["content"] for m in db.get_messages(sid)}.get(mid) == content, (sid, mid)
    print("OK", len(acked))
"""


def test_close_while_another_thread_writes_waits_for_that_write(tmp_path: Path) -> None:
    """Hermes' close() takes the lock its writes hold; the facade's closed the shared engine's
    writer connection under a write of another thread, and the process died in SQLite
    (segmentation fault). Now close waits for the write under way; later calls on the closed
    handle raise Hermes' AttributeError, and every call that returned is in the log."""
    done = run_child(_CLOSE_WHILE_WRITING, str(tmp_path / "state.db"), "25")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout
    assert "[\"AttributeError: 'NoneType' object has no attribute 'execute'\"]" in done.stdout, done.stdout
    with SessionDB(db_path=tmp_path / "state.db") as db:
        assert len(db.list_sessions_rich(limit=100)) == 25


def test_a_raw_cursor_outlives_a_rebuild_another_handle_made(tmp_path: Path) -> None:
    """A cursor from ``db._conn.execute`` keeps reading while the handle follows a rebuild (each
    delete makes one): the read that followed it closed the connection under the cursor, and the
    caller's next fetch raised ProgrammingError, where Hermes' one connection keeps reading."""
    path = tmp_path / "state.db"
    with SessionDB(db_path=path) as writer:
        for n in range(3):
            writer.create_session(f"s{n}", "cli")
            writer.append_message(f"s{n}", "user", f"hello {n}")
        for read_only in (True, False):
            reader = SessionDB(db_path=path, read_only=read_only)
            cursor = reader._conn.execute("SELECT session_id FROM messages ORDER BY id")
            assert cursor.fetchone()[0] == "s0"
            before = os.readlink(path)
            writer.delete_session("s2" if read_only else "s1")
            assert os.readlink(path) != before  # a new generation
            assert reader.get_session("s0") is not None  # follows it
            assert [r[0] for r in cursor.fetchall()] == (["s1", "s2"] if read_only else ["s1"])
            assert reader.get_session("s2") is None
            del cursor
            assert reader._conn.execute("SELECT count(*) FROM messages").fetchone()[0] == (2 if read_only else 1)
            reader.close()


def raw_count(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
    finally:
        conn.close()


def test_a_projection_truncated_under_a_writer_is_rebuilt_at_its_next_write(tmp_path: Path) -> None:
    """``> state.db`` truncates the generation the link names. The writer kept committing into
    its WAL on the empty file, acknowledged, while every reader (read_only handles, raw
    connections, Hermes' mcp_serve poller) failed on it for as long as no writing handle read."""
    path = tmp_path / "state.db"
    with SessionDB(db_path=path) as writer, SessionDB(db_path=path, read_only=True) as reader:
        writer.create_session("a", "cli")
        writer.append_message("a", "user", "hello")
        assert len(reader.get_messages("a")) == 1
        os.truncate(path, 0)  # through the link, like a shell redirect
        for n in range(3):
            writer.append_message("a", "user", f"after {n}")
            assert [m["content"] for m in reader.get_messages("a")][-1] == f"after {n}"
            assert raw_count(path) == n + 2



def test_garbage_over_the_projection_under_a_writer_is_rebuilt(tmp_path: Path, monkeypatch: Any) -> None:
    """Garbage over the generation's first page (a disk fault, a stray write through the link):
    the writer, working from its WAL, kept committing while every reader failed on the file
    ('file is not a database') for as long as no writing handle read. The writer now opens its
    file afresh every LOOK_EVERY_S, as a reader does, and rebuilds it when a reader could not."""
    monkeypatch.setattr(engine, "LOOK_EVERY_S", 0.0)
    path = tmp_path / "state.db"
    with SessionDB(db_path=path) as writer, SessionDB(db_path=path, read_only=True) as reader:
        writer.create_session("a", "cli")
        writer.append_message("a", "user", "hello")
        # Another process writes the garbage: plain I/O on a live database here would drop the
        # writer's own locks (DESIGN, known hazards).
        damage = run_child("""
            import os, sys
            with open(sys.argv[1], "r+b") as f:
                f.write(os.urandom(4096))
        """, str(path))
        assert damage.returncode == 0, damage.stderr
        for n in range(2):
            writer.append_message("a", "user", f"after {n}")
            assert [m["content"] for m in reader.get_messages("a")][-1] == f"after {n}"
            assert raw_count(path) == n + 2


def test_readers_keep_reading_when_db_path_is_removed(tmp_path: Path) -> None:
    """With the link removed, a handle's read raised 'unable to open database file' once (then
    read the old file again); Hermes' open connection keeps reading a removed file. The next
    write links a new generation, which every reader follows."""
    path = tmp_path / "state.db"
    with SessionDB(db_path=path) as writer:
        writer.create_session("a", "cli")
        writer.append_message("a", "user", "hello")
        readers = [SessionDB(db_path=path, read_only=True), SessionDB(db_path=path)]
        for reader in readers:
            assert reader.get_session("a") is not None
        os.unlink(path)
        time.sleep(0.15)  # past the handles' periodic check
        for reader in readers:
            assert [m["content"] for m in reader.get_messages("a")] == ["hello"]
        writer.append_message("a", "user", "again")
        assert os.path.islink(path)
        for reader in readers:
            assert [m["content"] for m in reader.get_messages("a")] == ["hello", "again"]
            reader.close()


def test_a_switch_killed_while_importing_leaves_no_copy_of_the_hermes_database(tmp_path: Path) -> None:
    """The switch imports from a private snapshot in the profile's folder; a process SIGKILLed
    while importing left that whole copy of the user's history there for good."""
    hermes = tmp_path / "state.db"
    conn = sqlite3.connect(hermes)
    conn.executescript(CURRENT_SCHEMA)
    conn.execute("INSERT INTO schema_version VALUES (22)")
    for n in range(3):
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'cli', 1.0)", (f"s{n}",))
        conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', ?, 1.0)",
                         [(f"s{n}", f"words {n}.{k}") for k in range(400)])
    conn.commit()
    conn.close()
    killed = run_child("""
        import os, signal, sys
        import sqlite_export.hermes
        from eventlog.adapters.hermes import importer, SessionDB
        real = importer.append_batch
        def append_then_die(*args, **kwargs):
            real(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        importer.append_batch = append_then_die
        SessionDB(db_path=sys.argv[1])
    """, str(hermes))
    assert killed.returncode == -9, killed.stderr[-2000:]
    profile = tmp_path / "state.db.eventlog" / "profiles" / "default"
    assert list(profile.glob(".import-*"))  # what the kill left
    assert hermes.is_file() and not hermes.is_symlink()  # the switch did not happen
    with SessionDB(db_path=hermes) as db:
        assert len(db.get_messages("s2")) == 400
    assert not list(profile.glob(".import-*"))
    assert sorted(p.name for p in profile.iterdir()) == ["hermes", "log"]


def test_what_a_rebuild_killed_in_its_swap_left_is_removed_by_the_next(tmp_path: Path) -> None:
    """Operator audit (helper-75): a process SIGKILLed inside a rebuild left the generation
    counter's temporary file or the temporary link beside ``db_path`` (``.state.db.<pid>.tmp``,
    in the Hermes home among the user's files) for good: each was only ever removed by a process
    of the same pid. The next rebuild (under the lease) removes them."""
    path = tmp_path / "state.db"
    layout = engine.projection.Layout(path)
    for kill_at in (1, 2):  # the counter's os.replace, then the link's
        child = textwrap.dedent(f"""
            import os, signal
            from eventlog.adapters.hermes import SessionDB
            calls, real = [], os.replace
            def replace(*a, **k):
                calls.append(1)
                if len(calls) == {kill_at}:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*a, **k)
            os.replace = replace
            SessionDB({str(path)!r})
        """)
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
        assert proc.returncode == -9, proc.stderr
        assert [n for n in os.listdir(layout.dir if kill_at == 1 else tmp_path) if n.endswith(".tmp")]
    db = SessionDB(path)
    db.create_session("s1", "cli")
    db.close()
    assert not [n for n in os.listdir(layout.dir) if n.endswith(".tmp")]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
