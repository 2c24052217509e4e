"""Switching an existing Hermes ``state.db`` to eventlog: one lossless import, once.

:func:`adopt` runs when a ``SessionDB`` opens a ``db_path`` that is still Hermes' own database
(a file, not the projection's link) and no log exists yet. It reads a snapshot of that file
(SQLite's backup API on a read-only connection: the original is never written), turns every row
of every Hermes table into ``hermes.rows_imported`` events — values, ids and the AUTOINCREMENT
counter verbatim, so the projection rebuilt from them equals the original row for row — writes
them into a new log beside it, and only when the log is complete moves it into place and moves
the original file (with its ``-wal``/``-shm``) aside to ``<db_path>.pre-eventlog``. A crash
before the log is in place leaves the original where it was and the next open starts again; a
crash between the two moves is finished by the next open, which finds ``import.pending``
naming the very file (device and inode) the log was imported from.

Stop Hermes processes that use the file before the first open with eventlog: a process that
still has the old file open would keep writing into the file that was moved aside.
"""
from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from eventlog.adapters.hermes import projection, schema
from eventlog.adapters.hermes.projection import fsync_dir
from eventlog.errors import StorageError
from sqlite_export.hermes import ImportReport, append_batch, hermes_events

log = logging.getLogger("eventlog.adapters.hermes")

EVENTS_PER_APPEND = 256
SIDECARS = ("-wal", "-shm", "-journal")


def snapshot(source: Path, into: Path) -> sqlite3.Connection:
    """A private copy of ``source`` (read-only open + backup API) brought to Hermes' current
    schema by Hermes itself when it is installed (its migrations, backfills and repairs run on
    the copy: the import holds what Hermes would show after opening the file), opened for
    reading."""
    from eventlog.adapters.hermes.installing import original_session_db
    from sqlite_export.hermes import hermes_upgrade, snapshot_source

    snapshot_source(source, into)
    hermes_upgrade(into, original_session_db())
    return sqlite3.connect(str(into))


def adopt(layout: projection.Layout) -> int:
    """Import the Hermes database at ``layout.pointer`` into a new log at ``layout.log_dir`` and
    move the original aside. Call under the projection lease, before the log is opened in this
    process. Returns the events written."""
    from eventlog.log.lmdb import EventLog, generation_dir

    # A compacted log keeps its data in log/g<N>/ (log/data.mdb is then a link to nowhere):
    # asking log/data.mdb alone took it for no log, and the import below replaced it.
    if (generation_dir(layout.log_dir) / "data.mdb").exists():
        existing = EventLog.open(layout.log_dir, profile=projection.PROFILE)
        try:
            head = existing.head()[0]
        finally:
            existing.close()
    else:
        head = 0
    pending = layout.profile / PENDING
    if head > 0 and _pending_names(pending, layout.pointer):
        _move_aside(layout)  # a crash between the two moves of the last switch: finish it
        pending.unlink()
        fsync_dir(layout.profile)
        return 0
    if head > 0 and _is_projection_copy(layout.pointer):
        # A copy of this profile's own projection put back in the link's place (Hermes'
        # `/snapshot restore` does that): the log is the profile's data and already holds more
        # than the copy, so the copy is kept aside and the projection rebuilt from the log.
        aside = _move_aside(layout, ".restored")
        log.warning("%s is a copy of the eventlog projection (a snapshot restore?): the log holds the profile's"
                    " history, so the file is kept as %s and the projection is rebuilt from the log"
                    " (restoring a snapshot is not supported)", layout.pointer, aside)
        return 0
    if head > 0 and not _holds_sessions(layout.pointer):
        # Not a Hermes database with sessions: an empty file (a plain sqlite3.connect on the
        # path while the link was missing makes one), garbage, a dangling link. Nothing to import
        # and nothing the log lacks: kept aside, and the projection rebuilt from the log (it was
        # refused for good before: outside audit, helper-39).
        aside = _move_aside(layout, ".displaced")
        log.warning("%s held no Hermes sessions (empty, unreadable or not Hermes'); it is kept as %s and the"
                    " projection is rebuilt from the log", layout.pointer, aside)
        return 0
    if head > 0:
        raise StorageError(
            f"{layout.pointer} is a Hermes database, but an eventlog log already exists at {layout.log_dir}",
            hint="move one of them away: the log holds this profile's history since the switch; "
                 "import the file into a fresh directory to compare")
    source = Path(os.path.realpath(layout.pointer))
    staging = layout.profile / "log.importing"
    shutil.rmtree(staging, ignore_errors=True)
    written = 0
    from projections.files import scratch_prefix, sweep_scratch

    # Under the lease, so no switch runs: what a switch killed while importing left, a whole copy
    # of the Hermes database, which stayed for good (outside audits, helper-52 and -53).
    sweep_scratch(layout.profile, every="import")
    with tempfile.TemporaryDirectory(dir=layout.profile, prefix=scratch_prefix("import")) as tmp:
        conn = snapshot(source, Path(tmp) / "snapshot.db")
        try:
            target = EventLog.open(staging, profile=projection.PROFILE)
            report = ImportReport()  # a message too large for one event keeps what fits, with a warning
            try:
                batch: list[dict[str, Any]] = []
                for ev in hermes_events(conn):
                    batch.append(ev)
                    if len(batch) >= EVENTS_PER_APPEND:
                        written += append_batch(target, batch, report)
                        batch = []
                if batch:
                    written += append_batch(target, batch, report)
            finally:
                target.close()
            for warning in report.warnings:
                log.warning("importing %s: %s", source, warning)
        finally:
            conn.close()
    st = os.stat(source)
    with open(pending, "w", encoding="utf-8") as f:  # the log that is about to appear came from this file
        f.write(f"{st.st_dev} {st.st_ino}\n")
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(layout.log_dir, ignore_errors=True)
    os.rename(staging, layout.log_dir)
    fsync_dir(layout.log_dir.parent)
    aside = _move_aside(layout)
    pending.unlink()
    fsync_dir(layout.profile)
    log.warning("imported %s into eventlog (%d events); the original is kept as %s", source, written, aside)
    return written


PENDING = "import.pending"
"""Written (device and inode of the imported file) before the new log is moved into place and
removed once the original is moved aside."""


def _pending_names(pending: Path, pointer: Path) -> bool:
    """True when ``pending`` records the file now at ``pointer`` as the one the log came from."""
    try:
        dev, ino = (int(x) for x in pending.read_text(encoding="utf-8").split())
        st = os.stat(os.path.realpath(pointer))
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def _is_projection_copy(path: Path) -> bool:
    """True when the file at ``path`` is a copy of a facade projection (its cursor table)."""
    try:
        conn = sqlite3.connect(f"file:{os.path.realpath(path)}?mode=ro&immutable=1", uri=True)
        try:
            return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (schema.CURSOR_TABLE,)).fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def _holds_sessions(path: Path) -> bool:
    """True when the file at ``path`` is an SQLite database whose ``sessions`` table has a row,
    or may be: one another process has locked (a Hermes still running, in an exclusive
    transaction or locking mode) is not known to hold nothing, so it is not moved aside (it was,
    as "no sessions": outside audit, helper-42)."""
    try:
        conn = sqlite3.connect(f"file:{os.path.realpath(path)}?mode=ro", uri=True, timeout=0.5)
        try:
            return conn.execute("SELECT 1 FROM sessions LIMIT 1").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error as e:
        code = getattr(e, "sqlite_errorcode", None)
        busy = (code & 0xFF in (5, 6)) if isinstance(code, int) else "locked" in str(e) or "busy" in str(e)
        return busy


def _move_aside(layout: projection.Layout, suffix: str = "") -> Path:
    """Move the database at ``db_path`` (and its sidecars) to the first free
    ``.pre-eventlog`` name (``suffix``: after it, e.g. ``.restored``)."""
    first = layout.original.with_name(layout.original.name + suffix)
    aside = first
    n = 1
    while os.path.lexists(aside):
        n += 1
        aside = first.with_name(f"{first.name}.{n}")
    os.rename(layout.pointer, aside)
    for suffix in SIDECARS:
        if os.path.lexists(f"{layout.pointer}{suffix}"):
            os.rename(f"{layout.pointer}{suffix}", f"{aside}{suffix}")
    fsync_dir(layout.pointer.parent)
    return aside
