"""The Hermes projection is built only from the verified prefix of the log, as eventlog's own
projections are (docs/RELIABILITY.md): an event tampered with after it was written is not served
by the facade, nor by a raw reader of db_path; the damage is recorded and appends are refused.
The projection's catch-up read the log unchecked and served the forged text (outside audit,
helper-55, found on the adapters' read paths)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import pytest

from eventlog.adapters.hermes import SessionDB
from eventlog.errors import IntegrityError
from eventlog.log import codec
from eventlog.log.lmdb import EventLog, generation_dir, seq_key

ROOT = Path(__file__).resolve().parent.parent


WRITE = textwrap.dedent("""
    import sys
    from eventlog.adapters.hermes import SessionDB
    db = SessionDB(sys.argv[1])
    db.create_session("s1", "cli")
    for role, text in (("user", "genuine"), ("assistant", "second"), ("user", "third")):
        db.append_message("s1", role, text)
    db.close()
""")


def _forge(log_dir: Path, marker: str, text: str) -> int:
    """Rewrite the event whose message content is ``marker`` to say ``text``, keeping its hash
    (the canonical JSON: a first-format value any reader decodes); returns its seq. Run before
    this process opens the facade (LMDB must not be open twice in one process)."""
    with EventLog.open(log_dir) as lg:
        found = [env for env in lg.read() if isinstance(env.get("data"), dict) and env["data"].get("content") == marker]
    assert len(found) == 1, found
    forged = found[0]
    forged["data"]["content"] = text
    env = lmdb.open(str(generation_dir(log_dir)), max_dbs=8)
    try:
        events = env.open_db(b"events")  # (outside the write transaction: opening a table takes one)
        with env.begin(write=True) as txn:
            txn.put(seq_key(forged["seq"]), codec.canonical(forged), db=events)
    finally:
        env.close()
    return int(forged["seq"])


def test_a_tampered_event_is_not_served_by_the_hermes_projection(tmp_path: Path) -> None:
    db_path = tmp_path / "state.db"
    done = subprocess.run([sys.executable, "-c", WRITE, str(db_path)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert done.returncode == 0, done.stderr
    log_dir = tmp_path / "state.db.eventlog" / "profiles" / "default" / "log"
    seq = _forge(log_dir, "second", "forged")
    for name in os.listdir(tmp_path / "state.db.eventlog" / "profiles" / "default" / "hermes"):
        if name.startswith("state."):  # the projection is gone: the next open rebuilds it from the log
            os.remove(tmp_path / "state.db.eventlog" / "profiles" / "default" / "hermes" / name)
    db = SessionDB(db_path)
    try:
        contents = [m["content"] for m in db.get_messages("s1")]
        assert "forged" not in contents, "a tampered event reached the Hermes projection"
        assert contents == ["genuine"]
        with pytest.raises(IntegrityError):  # the damage is recorded: nothing more is appended
            db.append_message("s1", "user", "after")
    finally:
        db.close()
    raw = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        assert [r[0] for r in raw.execute("SELECT content FROM messages ORDER BY id")] == ["genuine"]
    finally:
        raw.close()
    assert json.loads((log_dir / "damaged.json").read_text())["seq"] == seq
