"""The search index of a full rebuild, built beside state.db instead of after it.

A full rebuild used to build state.db, swap it in, and only then build the search index from it
(one ``INSERT … SELECT``): 40% of the rebuild, on one core while the other idled. Here the state
file is written in WAL mode and committed every :data:`projections.build.BULK_FLUSH` events;
after each commit a thread of this module indexes the messages just committed, reading the state
file through its own connection. Its statements run inside SQLite, without the GIL, so on two
cores the index costs the rebuild little more than the state file alone. (Indexing rows handed
over from the applier was measured slower than building in sequence: binding each row in Python
fought the applier for the GIL.)

**Exactness.** Each chunk of messages is read in one read transaction, together with the state
file's cursor in it (``snapshot``): the chunk's messages as of that seq. A message a later event
deleted (its session deleted or erased) was indexed exactly when its deletion came after the
snapshot of the chunk that read it; such messages are deleted from the index at the end with
the values ``fts_pending`` kept for them (a contentless index needs what it was given). The
finished index must hold as many documents as the state file holds messages, or it is not used.

**Lifecycle.** The builder thread is owned by :meth:`projections.build.Builder.rebuild_state`:
told of every commit (:meth:`Indexer.committed`), then of the end (:meth:`Indexer.finish`), or
aborted. It detaches from the state file as soon as it has read the last chunk, so the state
file can be closed, synced and swapped in while the index is finished. Nothing is swapped in by
this module; a failure is reported by :meth:`Indexer.result` and leaves no file behind.
"""
from __future__ import annotations

import bisect
import os
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from projections import db as sql
from projections import files, fts
from projections.site import write_cursor

CHUNK_IDS = 10000
"""At most this many seqs per read transaction: how long the builder may wait for the thread."""
_CHUNK = f"SELECT id, {fts.INDEXED_VALUES} FROM s.messages WHERE id > ? AND id <= ? ORDER BY id"


class Indexer:
    """Builds the index generation ``g`` from the state file at ``state_path`` while it is written."""

    def __init__(self, g: files.Generation, state_path: Path, profile: str | None, log_id: str) -> None:
        self.g = g
        self.state_path = state_path
        self.profile = profile
        self.log_id = log_id
        self.documents = 0
        self.held: int | None = None  # the generation's lock, taken and released by the builder
        self.pinned = threading.Event()
        self.released = threading.Event()  # the thread no longer reads the state file
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="eventlog-index-build", daemon=True)

    def start(self) -> "Indexer":
        self._thread.start()
        return self

    def committed(self, seq: int) -> None:
        """The state file has committed every event up to ``seq``."""
        self._queue.put(("chunk", seq))

    def finish(self, last_seq: int, last_hash: str | None) -> None:
        """The state file is complete (committed) up to ``last_seq``: index the rest, then
        finish the index. Returns once the thread reads the state file in one transaction
        pinned at that commit (at most one chunk's read later, however far behind it is): the
        file can then be checkpointed, synced and swapped in while the thread reads on, and
        writes made to it after the swap are not in what the thread sees."""
        self._queue.put(("final", last_seq, last_hash))
        self.pinned.wait()

    def abort(self) -> None:
        """Stop building (the state file failed); the caller deletes the generation."""
        self._queue.put(("abort",))
        if self._thread.ident is not None:  # started
            self._thread.join()

    def result(self) -> int:
        """Wait for the index; its document count, or the error that stopped it."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.documents

    def _run(self) -> None:
        try:
            _lower_priority()
            self._build()
        except BaseException as e:  # noqa: BLE001 - reported by result(); the file is deleted there
            self._error = e
        finally:
            self.pinned.set()
            self.released.set()

    def _build(self) -> None:
        from projections.build import new_index_file  # build imports this module

        out = new_index_file(self.g.path, self.profile, self.log_id)
        try:
            bulk = fts.Bulk(out, "main")
            chunks: list[tuple[int, int, int]] = []  # (after id, up to id, the state file's seq when read)
            lo, hint = 0, 0
            final: tuple[Any, ...] | None = None
            while final is None:
                # Everything queued at once: behind the builder, the next read covers what it has
                # committed meanwhile (capped), and the end is seen as soon as it is sent.
                msgs = [] if hint > lo else [self._queue.get()]
                while True:
                    try:
                        msgs.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                for msg in msgs:
                    if msg[0] == "abort":
                        return
                    if msg[0] == "final":
                        final = msg
                    else:
                        hint = max(hint, msg[1])
                if not chunks:  # attached once the state file has its tables and is in WAL mode
                    # Read-write though it only reads: when it is the last to let go of the state
                    # file, it checkpoints and deletes the WAL (a read-only connection leaves it).
                    sql.attach_rw(out, self.state_path, "s")
                # One read transaction: the chunk and the cursor it was read at.
                out.execute("BEGIN")
                snapshot = out.execute("SELECT value FROM s.meta WHERE key = 'last_seq'").fetchone()[0]
                if final is not None:
                    _, last_seq, last_hash = final
                    if snapshot != last_seq:
                        raise RuntimeError(f"the state file is at seq {snapshot}, its build ended at {last_seq}")
                    self.pinned.set()  # this transaction sees the finished file, whatever comes after
                    hi = last_seq
                else:
                    hi = min(hint, lo + CHUNK_IDS)
                bulk.add_from(_CHUNK, (lo, hi))
                chunks.append((lo, hi, snapshot))
                lo = hi
                if final is not None:
                    pending = out.execute(f"SELECT id, seq, {fts.INDEXED_VALUES} FROM s.fts_pending").fetchall()
                    expected = out.execute("SELECT count(*) FROM s.messages").fetchone()[0]
                out.execute("COMMIT")
            out.execute("DETACH DATABASE s")
            self.released.set()
            out.execute("BEGIN")
            bulk.delete([(mid, *values) for mid, seq, *values in pending if _was_indexed(chunks, mid, seq)])
            documents = bulk.finish()
            if documents != expected:
                raise RuntimeError(f"the index built beside state.db holds {documents} documents for "
                                   f"{expected} messages")
            write_cursor(out, last_seq, last_hash)
            out.execute("COMMIT")
            out.execute("PRAGMA journal_mode = WAL")
        finally:
            out.close()
        files.fsync_file(self.g.path)
        self.documents = documents


def _lower_priority() -> None:
    """Run this thread at a lower CPU priority (Linux: a thread has its own nice value), so
    that on a busy machine the state file, which list_sessions waits for, keeps its core and
    the index takes what is left; on an idle one nothing changes."""
    if not sys.platform.startswith("linux"):  # elsewhere a thread id is no process id to renice
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10))
    except (AttributeError, OSError):
        pass


def _was_indexed(chunks: list[tuple[int, int, int]], mid: int, deleted_seq: int) -> bool:
    """Whether the message ``mid``, deleted by the event at ``deleted_seq``, was in the chunk that
    covered its id: it was unless the deletion was already in that chunk's snapshot."""
    i = bisect.bisect_left(chunks, mid, key=lambda c: c[1])  # the first chunk reaching mid
    if i == len(chunks) or mid <= chunks[i][0]:
        return False
    return deleted_seq > chunks[i][2]
