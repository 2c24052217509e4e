"""Erase during a hot update: a process of an earlier release, whose projection schema is older,
runs on the profile with its own files (its private pointers ``state.v<N>.db``/``fts.v<N>.db``,
see projections/files.py). Such a release may know nothing of erases: its catch-up skips the
``log.erased`` record, so its files kept the erased words and it went on serving them (outside
audit, helper-79, with the release of commit a37a03f running beside this one). The old files are
built here as that release leaves them; no git history is needed."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from eventlog.sessions.store import SessionStore
from projections.schema import FTS_SCHEMA, STATE_SCHEMA
from tests.test_erase import MARKER, fill, traces

HOLDER = r"""
import fcntl, os, sys, time
fds = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)  # what every process of that release holds while it runs
    fds.append(fd)
print("held", flush=True)
time.sleep(600)
"""


def copy_db(src: Path, dst: Path) -> None:
    """A SQLite copy of ``src`` at ``dst`` through the backup API (never plain file I/O)."""
    a = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    b = sqlite3.connect(dst)
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()


def test_an_erase_removes_an_earlier_releases_projection_files_while_it_runs(tmp_path: Path) -> None:
    profile = tmp_path / "profiles" / "p"
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        secret, child, ordinary = fill(store)
        assert store.search(MARKER)["results"]
        # An earlier release's files: older schemas, named by its private pointers, with the words.
        old_state, old_fts = STATE_SCHEMA - 1, FTS_SCHEMA - 1
        copy_db(profile / "state.db", profile / f"state.7.v{old_state}.db")
        copy_db(profile / "fts.db", profile / f"fts.7.v{old_fts}.db")
        (profile / f"state.v{old_state}.db").symlink_to(f"state.7.v{old_state}.db")
        (profile / f"fts.v{old_fts}.db").symlink_to(f"fts.7.v{old_fts}.db")
        # A newer release's file is its own to purge (it knows erases): left alone.
        copy_db(profile / "state.db", profile / f"state.8.v{STATE_SCHEMA + 1}.db")
        newer = profile / f"state.8.v{STATE_SCHEMA + 1}.db"
        assert any(str(p).startswith(f"state.7.v{old_state}.db") for p in traces(profile))
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(profile / f"state.v{old_state}.lock"),
             str(profile / f"fts.v{old_fts}.lock")], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            before_ordinary = store.get_messages(ordinary)
            out = store.erase_session(secret, "forget it")
            assert sorted(out["sessions"]) == sorted([secret, child])
            left = [t for t in traces(profile) if not t.startswith(newer.name)]
            assert left == [], left
            assert not (profile / f"state.v{old_state}.db").is_symlink()
            assert not (profile / f"fts.v{old_fts}.db").is_symlink()
            assert newer.exists()
            assert store.get_session(secret) is None and store.get_messages(ordinary) == before_ordinary
            assert store.search(MARKER)["results"] == [] and store.log.verify().ok
        finally:
            holder.kill()
            holder.wait()
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        assert store.get_messages(ordinary) == before_ordinary
    assert [t for t in traces(profile) if not t.startswith(newer.name)] == []
