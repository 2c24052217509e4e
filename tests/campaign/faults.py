"""Real-bytes faults for the reliability tests and the campaign: a damaged event in the LMDB log
(written with raw LMDB and the storage format's own encoder, as a forger or a bad disk would),
a directory where a projection file belongs, FTS content damaged, garbage over ``lock.mdb``,
a SQL edit of a state.db row.

Every helper works on a profile no process of the caller has open (plain file I/O and raw
LMDB), except :func:`garbage_lock_file`, which is the point of its case. Imported by child
processes too: no pytest here.
"""
from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path
from typing import Any

DAMAGE_KINDS = ("invalid_json", "content_flip", "deleted")


def _raw_env(log_dir: Path) -> tuple[Any, Any, Any, Any]:
    import lmdb

    from eventlog.log import stored

    env = lmdb.open(str(log_dir), max_dbs=8)
    events, meta = env.open_db(b"events"), env.open_db(b"meta")

    def load(dict_id: int) -> bytes | None:
        with env.begin() as txn:
            found = txn.get(b"zdict:%d" % dict_id, db=meta)
        return None if found is None else bytes(found)

    return env, events, meta, stored.Compression(load)


def stored_value(log_dir: Path, seq: int) -> bytes | None:
    """The bytes stored for ``seq`` (to put back later), read with raw LMDB."""
    from eventlog.log.lmdb import seq_key

    env, events, _meta, _ = _raw_env(log_dir)
    try:
        with env.begin() as txn:
            found = txn.get(seq_key(seq), db=events)
        return None if found is None else bytes(found)
    finally:
        env.close()


def put_value(log_dir: Path, seq: int, value: bytes) -> None:
    """Store ``value`` at ``seq`` verbatim (a restore from a backup of that one event)."""
    from eventlog.log.lmdb import seq_key

    env, events, _meta, _ = _raw_env(log_dir)
    try:
        with env.begin(write=True) as txn:
            txn.put(seq_key(seq), value, db=events)
    finally:
        env.close()


def damage_event(log_dir: Path, seq: int, kind: str) -> dict[str, Any]:
    """Damage event ``seq`` of the closed log at ``log_dir``; returns its envelope as it was.

    ``invalid_json``: its data bytes are cut short (no longer JSON); ``content_flip``: one
    character of its content changed (still valid JSON, same hash: a tampered event);
    ``deleted``: the event removed (a gap)."""
    from eventlog.log import codec, stored
    from eventlog.log.lmdb import seq_key

    env, events, _meta, compression = _raw_env(log_dir)
    try:
        with env.begin(write=True) as txn:
            value = txn.get(seq_key(seq), db=events)
            assert value is not None, f"no event {seq}"
            before = stored.envelope(seq, bytes(value), compression)
            if kind == "deleted":
                assert txn.delete(seq_key(seq), db=events)
                return before
            data = codec.canonical(before["data"])
            if kind == "invalid_json":
                payload = data[:-1]
            elif kind == "content_flip":
                changed = dict(before["data"])
                text = changed.get("content")
                changed["content"] = ("X" + text[1:]) if isinstance(text, str) and text else "X"
                payload = codec.canonical(changed)
            else:
                raise ValueError(kind)
            raw = stored.pack_parts(before["type"], before["v"], before["session"], before["id"], before["ts"],
                                    before["prev"], before["hash"], 0, 0, payload)
            txn.put(seq_key(seq), raw, db=events)
        return before
    finally:
        env.close()


def directory_in_place(profile_dir: Path, kind: str, *, with_content: bool = True) -> None:
    """Replace the pointer ``<kind>.db`` (state or fts) by a directory (with a file inside)."""
    pointer = profile_dir / f"{kind}.db"
    os.unlink(pointer)
    pointer.mkdir()
    if with_content:
        (pointer / "notes.txt").write_text("someone's file\n")


def fts_file(profile_dir: Path) -> Path:
    from projections import files

    g = files.read_pointer(profile_dir / "fts.db")
    assert g is not None
    return g.path


def state_file(profile_dir: Path) -> Path:
    from projections import files

    g = files.read_pointer(profile_dir / "state.db")
    assert g is not None
    return g.path


FTS_DAMAGE = ("delete_all", "half_index", "random_pages")


def damage_fts(profile_dir: Path, kind: str, seed: int = 0) -> None:
    """Damage the FTS word index with SQL or bytes (no process may have it open):
    ``delete_all`` empties it, ``half_index`` removes every other message's words (FTS5's
    own 'delete' command, given the values state.db holds), ``random_pages`` overwrites its
    data blocks."""
    from projections import fts

    path = fts_file(profile_dir)
    db = sqlite3.connect(path)
    try:
        if kind == "random_pages":
            db.execute("UPDATE fts_data SET block = randomblob(length(block)) WHERE id > 10")
        elif kind == "delete_all":
            db.execute("INSERT INTO fts (fts) VALUES ('delete-all')")
        elif kind == "half_index":
            fts.register(db)
            db.execute("ATTACH DATABASE ? AS s", (str(state_file(profile_dir)),))
            db.execute(f"INSERT INTO fts (fts, rowid, content, tool_name, tool_calls) "
                       f"SELECT 'delete', id, {fts.INDEXED_VALUES} FROM s.messages WHERE id % 2 = 1")
        else:
            raise ValueError(kind)
        db.commit()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


def sql_edit(profile_dir: Path, message_id: int | None = None) -> tuple[int, str]:
    """Change one message's content in state.db with SQL; returns ``(message id, new text)``."""
    db = sqlite3.connect(state_file(profile_dir))
    try:
        if message_id is None:
            row = db.execute("SELECT id FROM messages WHERE content IS NOT NULL AND content_json = 0 "
                             "ORDER BY id LIMIT 1").fetchone()
            assert row is not None, "no text message to edit"
            message_id = int(row[0])
        text = "edited behind the projector's back"
        db.execute("UPDATE messages SET content = ? WHERE id = ?", (text, message_id))
        db.commit()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return message_id, text
    finally:
        db.close()


def garbage_lock_file(log_dir: Path, seed: int = 0) -> None:
    """Overwrite ``lock.mdb`` in place with random bytes (its size kept): while processes have it
    mapped, as a stray program writing to the wrong file would."""
    lock = log_dir / "lock.mdb"
    rng = random.Random(seed)
    size = lock.stat().st_size
    with open(lock, "r+b") as f:
        f.write(rng.randbytes(size))
