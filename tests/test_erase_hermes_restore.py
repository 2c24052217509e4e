"""A file put at a Hermes ``db_path`` after the profile's log was compacted — and every Hermes
delete compacts it, as its erase does. The switch asked whether a log was there by looking for
``log/data.mdb``, which a compaction turns into a link to a path nothing can create (the data
lives in ``log/g<N>/``): it saw none, took the file for Hermes' own database and imported it,
removing the log first. A `/snapshot restore` (the case HERMES.md names) then brought back the
sessions Hermes had deleted, words and all, and lost every write since the snapshot; an empty
file there (a plain ``sqlite3.connect`` on the missing link) left an empty log (outside audit,
helper-74). The file is kept aside and the projection rebuilt from the log, as for a log never
compacted."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog.adapters.hermes import SessionDB
from eventlog.adapters.hermes.projection import Layout
from eventlog.log.lmdb import generation_dir

sys.path.insert(0, str(Path(__file__).parent))
from test_erase import MARKER, traces  # noqa: E402


def verify(path: Path) -> str:
    code = ("import sys; from eventlog.log.lmdb import EventLog\n"
            "log = EventLog.open(sys.argv[1]); r = log.verify(); print(r.ok, r.erased, log.head()[0]); log.close()")
    return subprocess.run([sys.executable, "-c", code, str(Layout(path).log_dir)], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("put_back", ["a snapshot of the projection", "an empty file"])
def test_a_file_at_db_path_after_a_delete_keeps_the_log_and_brings_back_nothing_erased(
        tmp_path: Path, put_back: str) -> None:
    path = tmp_path / "state.db"
    db = SessionDB(path)
    db.create_session("gone", "cli")
    db.append_message("gone", "user", f"delete me {MARKER}")
    db.create_session("kept", "cli")
    db.append_message("kept", "user", "before the snapshot")
    snapshot = tmp_path / "snap.db"
    src = sqlite3.connect(os.path.realpath(path))
    dst = sqlite3.connect(snapshot)
    src.backup(dst)
    src.close()
    dst.close()
    assert db.delete_session("gone")  # its erase compacts the log into log/g<N>/
    db.append_message("kept", "user", "after the snapshot")
    db.close()
    log_dir = Layout(path).log_dir
    assert generation_dir(log_dir) != log_dir
    before = verify(path)
    assert traces(tmp_path / "state.db.eventlog") == []
    path.unlink()
    if put_back == "an empty file":
        snapshot.unlink()
        path.write_bytes(b"")
    else:
        os.replace(snapshot, path)
    db = SessionDB(path)
    try:
        assert path.is_symlink()
        assert db.get_session("gone") is None
        assert [m["content"] for m in db.get_messages("kept")] == ["before the snapshot", "after the snapshot"]
    finally:
        db.close()
    assert verify(path) == before  # the same log: nothing imported, nothing lost
    assert traces(tmp_path / "state.db.eventlog") == []
    aside = [n for n in os.listdir(tmp_path) if n.startswith("state.db.pre-eventlog")]
    assert aside == ["state.db.pre-eventlog.restored" if put_back != "an empty file" else "state.db.pre-eventlog.displaced"]
