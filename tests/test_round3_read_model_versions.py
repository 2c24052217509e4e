"""Two versions of one extension read model, in two processes on one profile (a hot update: an
old gateway beside a new CLI). Both share the read model's tables, and each process rebuilds
them as its own version when it catches up; a reader still sees its own version's rows, its own
appends included, for the whole of its ``with store.read_model(...)`` block."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from eventlog.sessions.extensions import Extension
from eventlog.sessions.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent

# The extension at version 1 or 2, as a child process builds it (the same text runs here).
TALLY = '''
from eventlog.sessions.extensions import EventType, Extension, ReadModel

def apply1(conn, env):
    if env["type"] == "tally.counted":
        conn.execute("INSERT INTO tally_v (seq, n) VALUES (?, ?)", (env["seq"], env["data"]["n"]))

def apply2(conn, env):
    if env["type"] == "tally.counted":
        conn.execute("INSERT INTO tally_v (seq, n, doubled) VALUES (?, ?, ?)",
                     (env["seq"], env["data"]["n"], 2 * env["data"]["n"]))

def tally(version):
    rm = (ReadModel("tally", 1, ["CREATE TABLE tally_v (seq INTEGER PRIMARY KEY, n INTEGER)"], apply1)
          if version == 1 else
          ReadModel("tally", 2, ["CREATE TABLE tally_v (seq INTEGER PRIMARY KEY, n INTEGER, doubled INTEGER)"],
                    apply2))
    return Extension("tally", event_types=[EventType("tally.counted", version, upcasters={1: lambda d: d})],
                     read_models=[rm])
'''

# A child that appends one event and reads the read model at its version (rebuilding its tables).
TOUCH = TALLY + '''
import sys
from eventlog.sessions.store import SessionStore
home, version = sys.argv[1], int(sys.argv[2])
with SessionStore.open(home, "p", extensions=[tally(version)], follower=False) as s:
    seq = s.append_events([{"type": "tally.counted", "session": "t", "data": {"n": version}}])[0]
    with s.read_model("tally", wait=30) as c:
        rows = c.execute("SELECT * FROM tally_v ORDER BY seq").fetchall()
    assert rows and rows[-1][0] == seq and all(len(r) == version + 1 for r in rows), rows
print("ok")
'''

# A child that appends and reads in a loop, counting reads that were not its own version's rows
# with its own append.
LOOP = TALLY + '''
import sys
from eventlog.sessions.store import SessionStore
home, version, reads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bad = []
with SessionStore.open(home, "p", extensions=[tally(version)], follower=False) as s:
    for _ in range(reads):
        seq = s.append_events([{"type": "tally.counted", "session": "t", "data": {"n": version}}])[0]
        with s.read_model("tally", wait=60) as c:
            rows = c.execute("SELECT * FROM tally_v ORDER BY seq").fetchall()
            again = c.execute("SELECT count(*) FROM tally_v").fetchone()[0]
        if not rows or rows[-1][0] < seq or any(len(r) != version + 1 for r in rows) or again != len(rows):
            bad.append(rows[-1:])
print("bad", len(bad), bad[:3])
'''


def tally(version: int) -> Extension:
    scope: dict[str, Any] = {}
    exec(TALLY, scope)
    ext: Extension = scope["tally"](version)
    return ext


def child(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def touch(home: Path, version: int) -> None:
    """Another process opens the profile with ``version`` and reads: the tables become its own."""
    p = child(TOUCH, home, version)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.strip() == "ok", err


def counted(version: int) -> dict[str, Any]:
    return {"type": "tally.counted", "session": "t", "data": {"n": version}}


def test_a_read_keeps_its_version_while_another_process_rebuilds_the_tables(home: Path) -> None:
    touch(home, 2)
    with SessionStore.open(home, "p", extensions=[tally(1)], follower=False) as s:
        mine = s.append_events([counted(1)])[0]
        with s.read_model("tally", wait=30) as conn:
            # The other version rebuilds the tables after this block was given its connection,
            # before its first read: its reads were of version 2's table (three columns).
            touch(home, 2)
            rows = conn.execute("SELECT * FROM tally_v ORDER BY seq").fetchall()
            assert [len(r) for r in rows] == [2] * len(rows) and rows[-1][0] == mine
            assert conn.execute("SELECT value FROM meta WHERE key = 'ext:tally:version'").fetchone() == (1,)
            # A caller's own transactions on the connection (the LangGraph saver's BEGIN ...
            # COMMIT) are allowed and see the same rows, before and after another rebuild.
            conn.execute("BEGIN")
            inside = conn.execute("SELECT * FROM tally_v ORDER BY seq").fetchall()
            conn.execute("COMMIT")
            touch(home, 2)
            after = conn.execute("SELECT * FROM tally_v ORDER BY seq").fetchall()
            assert inside == rows and after == rows
        # The next read brings the tables back to this version, its appends and the others' in.
        with s.read_model("tally", wait=30) as conn:
            again = conn.execute("SELECT seq, n FROM tally_v ORDER BY seq").fetchall()
        assert [seq for seq, _ in again] == list(range(1, s.log.head()[0] + 1))
        assert (mine, 1) in again and all(len(r) == 2 for r in again)


def test_two_versions_reading_in_a_loop_each_see_their_own_rows(home: Path) -> None:
    SessionStore.open(home, "p", extensions=[tally(1)], follower=False).close()
    one, two = child(LOOP, home, 1, 150), child(LOOP, home, 2, 150)
    for p in (one, two):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        assert out.startswith("bad 0 "), out


def test_a_rebuild_builds_the_version_of_the_process_that_runs_it(home: Path) -> None:
    touch(home, 1)
    touch(home, 2)
    with SessionStore.open(home, "p", extensions=[tally(1)], follower=False) as s:
        s.rebuild("state")
        with s.read_model("tally", wait=30) as conn:  # the new file was built with version 1
            assert conn.execute("SELECT * FROM tally_v ORDER BY seq").fetchall() == [(1, 1), (2, 2)]
        touch(home, 2)  # the other process makes it its own
        with s.read_model("tally", wait=30) as conn:
            rows = conn.execute("SELECT * FROM tally_v ORDER BY seq").fetchall()
        assert [r[0] for r in rows] == [1, 2, 3] and all(len(r) == 2 for r in rows)
    # Once no process of version 1 is left, version 2 keeps the tables, with no table of version 1.
    touch(home, 2)
    state = sqlite3.connect(home / "profiles" / "p" / "state.db")
    try:
        tables = sorted(r[0] for r in state.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                    "AND name LIKE 'tally%'"))
        columns = [r[1] for r in state.execute("PRAGMA table_info(tally_v)")]
    finally:
        state.close()
    assert tables == ["tally_v"] and columns == ["seq", "n", "doubled"]


def test_a_caller_may_close_the_connection_inside_its_block(home: Path) -> None:
    with SessionStore.open(home, "p", extensions=[tally(1)], follower=False) as s:
        s.append_events([counted(1)])
        with s.read_model("tally", wait=30) as conn:
            assert conn.execute("SELECT n FROM tally_v").fetchall() == [(1,)]
            conn.close()
        with s.read_model("tally", wait=30) as conn:
            assert conn.execute("SELECT n FROM tally_v").fetchall() == [(1,)]
