"""An import's scratch copy of its source under the profile: ``eventlog import --format hermes``
and the Hermes switch each copy the whole source database into a temporary folder of the
profile. A process killed during the import left that copy there for good: no sweep knew it, so
every later erase of those sessions left their words in it (outside audit, helper-52). The
folders now carry their process's pid; the sweep at open and the purge after an erase remove
those of dead processes, and the switch, under its lease, every one an earlier switch left."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from eventlog.sessions.store import SessionStore
from projections.files import SCRATCH_STALE_S, scratch_prefix, sweep_scratch

sys.path.insert(0, str(Path(__file__).parent))
from test_erase import MARKER, traces  # noqa: E402
from test_hermes_import import v22  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _source(path: Path) -> Path:
    conn = v22(path)
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('secret', 'cli', 1000.0)")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('other', 'cli', 1000.0)")
    conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('secret', 'user', ?, 1001.0)",
                     [(f"{MARKER} {i}",) for i in range(20)])
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('other', 'user', 'plain', 1001.0)")
    conn.commit()
    conn.close()
    return path


def _killed_after_the_copy(code: str) -> None:
    """Run ``code`` in a child whose copy of the source is SIGKILLed as soon as it is made."""
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           timeout=120)
    assert child.returncode == -9


def test_an_import_killed_after_copying_its_source_leaves_no_copy_behind(tmp_path: Path) -> None:
    source, home = _source(tmp_path / "hermes.db"), tmp_path / "home"
    _killed_after_the_copy(f"""
        import os, signal
        import sqlite_export.hermes as h
        from eventlog.sessions.store import SessionStore
        copy = h.snapshot_source
        def copy_then_die(src, into):
            copy(src, into)
            os.kill(os.getpid(), signal.SIGKILL)
        h.snapshot_source = copy_then_die
        with SessionStore.open({str(home)!r}, "p", follower=False) as store:
            h.import_hermes(store, {str(source)!r})
    """)
    profile = home / "profiles" / "p"
    assert [p.name for p in profile.glob(".hermes-import-*")], "the kill left the copy (the test can fail)"
    assert traces(home)
    with SessionStore.open(home, "p", follower=False) as store:  # the next open sweeps it
        assert list(profile.glob(".hermes-import-*")) == [] and traces(home) == []
        from sqlite_export.hermes import import_hermes

        import_hermes(store, source)
        store.erase_session("secret", "asked")
        assert [m["content"] for m in store.get_messages("other")] == ["plain"]
    assert traces(home) == []


def test_a_switch_killed_after_copying_its_source_leaves_no_copy_behind(tmp_path: Path) -> None:
    path = _source(tmp_path / "state.db")
    _killed_after_the_copy(f"""
        import os, signal
        import eventlog.adapters.hermes.importer as imp
        from eventlog.adapters.hermes import SessionDB
        copy = imp.snapshot
        def copy_then_die(src, into):
            copy(src, into)
            os.kill(os.getpid(), signal.SIGKILL)
        imp.snapshot = copy_then_die
        SessionDB(db_path={str(path)!r})
    """)
    profile = tmp_path / "state.db.eventlog" / "profiles" / "default"
    assert [p.name for p in profile.glob(".import-*")], "the kill left the copy (the test can fail)"
    from eventlog.adapters.hermes import SessionDB

    db = SessionDB(db_path=path)  # the switch again, to its end
    try:
        assert list(profile.glob(".import-*")) == []
        assert db.delete_session("secret") is True
        assert [m["content"] for m in db.get_messages("other")] == ["plain"]
    finally:
        db.close()
    # (the original, moved aside as state.db.pre-eventlog, is Hermes' file as it was: not looked at)
    assert traces(tmp_path / "state.db.eventlog") == []


def test_the_sweep_keeps_a_live_imports_copy(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_path / f"{scratch_prefix('hermes-import')}abcd1234"
    gone = tmp_path / f".hermes-import-{dead.pid}-abcd1234"
    switch = tmp_path / f".import-{dead.pid}-efgh5678"
    earlier_new, earlier_old = tmp_path / ".hermes-import-0zangy0w", tmp_path / ".import-k2j4h5g6"
    unrelated = tmp_path / ".imports-of-mine"
    for d in (mine, gone, switch, earlier_new, earlier_old, unrelated):
        d.mkdir()
        (d / "snapshot.db").write_bytes(b"words")
    then = time.time() - SCRATCH_STALE_S - 60
    os.utime(earlier_old, (then, then))
    assert sorted(sweep_scratch(tmp_path)) == sorted([gone.name, switch.name, earlier_old.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, earlier_new.name, unrelated.name])
    # the switch holds the lease every switch holds: any .import-* folder is an earlier one's
    live_switch = tmp_path / f"{scratch_prefix('import')}abcd1234"
    live_switch.mkdir()
    assert sweep_scratch(tmp_path, every="import") == [live_switch.name]
    assert mine.exists() and earlier_new.exists()
