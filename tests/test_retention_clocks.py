"""Retention against clocks that are wrong: writers whose clock is behind, a host whose clock
is ahead. Real processes under libfaketime (``faketime -f OFFSET``), each with its own clock,
write one profile; the monotonic clock stays real (``FAKETIME_DONT_FAKE_MONOTONIC``), as it does
when a wall clock jumps."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

FAKETIME = shutil.which("faketime")
pytestmark = pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime's faketime (apt-get install faketime)")


# libfaketime 0.9.10 with a real monotonic clock fails Python's time.sleep (clock_nanosleep on an
# absolute monotonic deadline: EINVAL, whatever the offset), while select() and lock waits work:
# each child sleeps through select() so that a wait for a lock still works under it.
SLEEP = "import select, time\ntime.sleep = lambda s: select.select([], [], [], s) and None\n"


def python_at(offset: str, code: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Python ``code`` in a process whose wall clock is OFFSET from ours (``-400d``, ``+365d``;
    ``+0`` for the real one)."""
    env = {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([str(FAKETIME), "-f", offset, sys.executable, "-c", SLEEP + textwrap.dedent(code)],
                          env=env, check=check, capture_output=True, text=True, timeout=120)


def at(offset: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``eventlog --home HOME --profile p ARGS`` with its wall clock OFFSET from ours."""
    argv = ["eventlog", "--home", str(home), "--profile", "p", *args]
    return python_at(offset, f"import sys\nsys.argv = {argv!r}\nfrom eventlog.cli import main\nmain(prog_name='eventlog')",
                     check=False)


def test_a_session_written_by_a_host_whose_clock_is_behind_is_not_old(tmp_path: Path) -> None:
    """A host whose clock is a year behind (a reset RTC, a PostgreSQL host late against the
    others) writes a session now: its events come after every other in the log, stamped a year
    early. Retention on a right clock took them at their word and erased the session at once;
    an event appended after others was not written before them."""
    assert at("+0", tmp_path, "sessions", "new", "--id", "here").returncode == 0
    assert at("+0", tmp_path, "messages", "add", "here", "--role", "user", "--content", "hi").returncode == 0
    assert at("-400d", tmp_path, "sessions", "new", "--id", "late").returncode == 0
    assert at("-400d", tmp_path, "messages", "add", "late", "--role", "user", "--content", "now").returncode == 0
    # A writer that stamps its data with its own clock (as the Hermes facade does).
    python_at("-400d", f"""
        import time
        from eventlog import SessionStore
        with SessionStore.open({str(tmp_path)!r}, "p", follower=False) as store:
            sid = store.create_session(id="stamped", source="cli", started_at=time.time())
            store.append_message(sid, "user", "now too", timestamp=time.time())
    """)
    listed = json.loads(at("+0", tmp_path, "sessions", "list", "--json").stdout)
    assert {s["id"] for s in listed} == {"here", "late", "stamped"}
    planned = at("+0", tmp_path, "retention", "--older-than", "30d", "--dry-run", "--json")
    assert planned.returncode == 0 and json.loads(planned.stdout)["sessions"] == []
    # Times given as old on a right clock still count as given.
    python_at("+0", f"""
        from eventlog import SessionStore
        with SessionStore.open({str(tmp_path)!r}, "p", follower=False) as store:
            sid = store.create_session(id="ancient", source="cli", started_at=1_000_000_000.0)
            store.append_message(sid, "user", "old words", timestamp=1_000_000_001.0)
    """)
    done = at("+0", tmp_path, "retention", "--older-than", "30d", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["sessions"] == ["ancient"]
    # What the late host writes a year on (its clock caught up) ages as everything does.
    planned = at("+400d", tmp_path, "retention", "--older-than", "30d", "--dry-run", "--json")
    assert sorted(json.loads(planned.stdout)["sessions"]) == ["here", "late", "stamped"]


def test_a_host_whose_clock_is_ahead_says_so_before_and_after_it_erases(tmp_path: Path) -> None:
    """Retention judges age by this host's clock alone: one a year ahead finds every session old
    (nothing in the log can tell that from a profile left alone for a year). It said only
    `would erase 2 sessions` and `erased 2 sessions`, silently; the report now names the cutoff
    by that clock, and a warning says when every event in the log is older than it, so a dry
    run shows the wrong clock before anything goes."""
    for sid in ("a", "b"):
        assert at("+0", tmp_path, "sessions", "new", "--id", sid).returncode == 0
        assert at("+0", tmp_path, "messages", "add", sid, "--role", "user", "--content", "hi").returncode == 0
    here = at("+0", tmp_path, "retention", "--older-than", "30d", "--dry-run")
    assert here.returncode == 0 and here.stdout.startswith("would erase 0 sessions, inactive since")
    assert "clock" not in here.stderr
    ahead = at("+365d", tmp_path, "retention", "--older-than", "30d", "--dry-run")
    assert ahead.returncode == 0 and ahead.stdout.splitlines()[1:] == ["  b", "  a"]
    assert ahead.stdout.startswith("would erase 2 sessions, inactive since before ")
    assert ahead.stderr.startswith("warning: every event in the log is older than the cutoff") and "--dry-run" in ahead.stderr
    plan = json.loads(at("+365d", tmp_path, "retention", "--older-than", "30d", "--dry-run", "--json").stdout)
    assert plan["newest"] < plan["cutoff"] and sorted(plan["sessions"]) == ["a", "b"]
    assert 334 * 86400 < plan["cutoff"] - time.time() < 336 * 86400  # that host's clock less 30 days
    done = at("+365d", tmp_path, "retention", "--older-than", "30d")
    assert done.returncode == 0 and done.stdout.startswith("erased 2 sessions (")
    assert done.stderr.startswith("warning: every event in the log is older than the cutoff")
    # The erase record that host wrote is stamped a year ahead: a right clock says so.
    assert at("+0", tmp_path, "sessions", "new", "--id", "c").returncode == 0
    back = at("+0", tmp_path, "retention", "--older-than", "1s", "--dry-run")
    assert back.returncode == 0 and back.stdout.startswith("would erase 0 sessions")
    assert back.stderr.startswith("warning: the log holds events stamped up to ")


def test_imported_times_that_are_unknown_or_ahead_age_from_the_import(tmp_path: Path) -> None:
    """A Hermes ``state.db`` carries odd times (DESIGN.md names the TEXT timestamp and the epoch
    of 1e30): the read models show them as unknown, but retention read a string or a negative
    time as no activity at all — a 10-year retention erased at once a session imported a moment
    before — and a time in 2099 or past the range as activity then, so no retention ever erased
    it. Such a time is read as the import's own: its session ages from then."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fixtures_hermes import LEGACY_SCHEMA

    source = tmp_path / "hermes.db"
    odd = {"text": "2025-01-02 08:00:00", "negative": -86400.5, "ahead": 4.1e9,
           "beyond": 5e9, "wide": 2**63 - 1}
    conn = sqlite3.connect(source)
    conn.executescript(LEGACY_SCHEMA)
    with conn:
        for name, when in odd.items():
            conn.execute("INSERT INTO sessions (id, source, started_at, ended_at) VALUES (?, 'cli', ?, ?)",
                         (name, when, when))
            conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', ?, ?)",
                         (name, f"{name} words", when))
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('old', 'cli', 1000000000.0)")
    conn.close()
    home = tmp_path / "home"
    assert at("+0", home, "import", "--format", "hermes", str(source)).returncode == 0
    listed = json.loads(at("+0", home, "sessions", "list", "--json").stdout)
    assert len(listed) == 6
    decade = json.loads(at("+0", home, "retention", "--older-than", "3650d", "--dry-run", "--json").stdout)
    assert decade["sessions"] == ["old"]  # a time the source gave and the range holds counts as given
    later = json.loads(at("+2d", home, "retention", "--older-than", "1d", "--dry-run", "--json").stdout)
    assert sorted(later["sessions"]) == sorted([*odd, "old"])
