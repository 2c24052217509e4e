"""Operator audit (helper-75): Hermes' own maintenance commands run through the launcher
(``python -m eventlog.adapters.hermes ...``) on an eventlog-backed home. Needs the real Hermes
(marker ``hermes``; ``python3 run compat``)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import hermes_state
except ImportError:  # pragma: no cover - the marker keeps these tests out of such environments
    hermes_state = None

pytestmark = pytest.mark.hermes


def _hermes(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    env["HERMES_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "eventlog.adapters.hermes", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_sessions_repair_rebuilds_the_projection_from_the_log(tmp_path: Path) -> None:
    """`hermes sessions repair` on a projection whose schema was damaged ran Hermes' schema
    surgery on the projection file: it copied the file into the home as
    state.db.malformed-backup-<time> (sessions no later delete erases), failed, and told the
    user to keep both files. On an eventlog-backed home it now rebuilds the projection from the
    log, the only copy of the data, and leaves no copy behind."""
    home = tmp_path / "home"
    home.mkdir()
    real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    db = real(home / "state.db")
    db.create_session("20250101_100000_abcd", "cli")
    db.append_message("20250101_100000_abcd", "user", "how do lighthouses work")
    db.set_session_title("20250101_100000_abcd", "Lighthouses")
    db.close()
    assert _hermes(home, "sessions", "list").returncode == 0  # the switch
    conn = sqlite3.connect(os.path.realpath(home / "state.db"))
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql)"
                 " VALUES ('table', 'bogus', 'bogus', 0, 'CREATE TABLE bogus(')")
    conn.commit()
    conn.close()

    repaired = _hermes(home, "sessions", "repair")
    assert repaired.returncode == 0, repaired.stderr
    assert "Repaired" in repaired.stdout and "failed" not in repaired.stdout, repaired.stdout
    assert not [p.name for p in home.iterdir() if "backup" in p.name]
    again = _hermes(home, "sessions", "repair")
    assert "opens cleanly" in again.stdout, again.stdout
    listed = _hermes(home, "sessions", "list")
    assert listed.returncode == 0 and "Lighthouses" in listed.stdout, listed.stdout + listed.stderr
