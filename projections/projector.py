"""The projector: keeps a profile's state.db and FTS index derived from the log, and heals them.

One process at a time writes a profile's projections: whoever holds the flock lease
(``projector.lock``, :class:`projections.lease.Lease`). The lease is taken per unit of work (a
catch-up, a rebuild, a repair) and released at once, so any process can be the writer next;
its read-write connection is used only under the lease (and kept open, idle, between units).
Everyone else reads through ``mode=ro`` connections (:class:`projections.queries.Reader`).

:class:`Projector` is the coordinator: it owns the lease and hands the work to its pieces —

==========================  ====================================================================
:mod:`projections.catchup`  apply the log's new events in batches (rows + cursor in one
                            transaction), then to the FTS index
:mod:`projections.build`    rebuild into new generation files and swap them in; standalone
                            snapshots
:mod:`projections.heal`     health checks; rebuild exactly what is broken (an FTS fault alone)
:mod:`projections.follow`   the background follower thread and its presence
:mod:`projections.visibility`  what a read waits for (read-your-writes, trusting a follower)
==========================  ====================================================================

Its verbs: :meth:`~Projector.advance` brings the projections up to the log (the only one that
does), :meth:`~Projector.heal` repairs what is broken, :meth:`~Projector.rebuild` rebuilds on
demand, :meth:`~Projector.health` only looks.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from eventlog.errors import DiskFullError, LeaseError, ProjectionError, process_state
from eventlog.log import Log
from eventlog.profiles import flock_holder
from projections import db as sql
from projections import files
from projections.build import Builder, Progress
from projections.catchup import DEFAULT_BATCH, CatchUp, Writer, erase_due
from projections.extensions import ExtensionTables, extension_cursor
from projections.follow import FOLLOW_POLL, Follower
from projections.heal import Healer
from projections.health import HEALTHY, read_meta
from projections.lease import Lease, SchemaUse
from projections.site import SCHEMAS, Broken, Site
from projections.visibility import Reach, Visibility

if TYPE_CHECKING:
    from projections.queries import Reader

DEFAULT_LEASE_TIMEOUT = 120.0
IDLE_S = 0.5
STOPPED_POLL_S = 0.25
"""How often a wait for the projector lease looks whether its holder is stopped."""
STOPPED_GRACE_S = 1.0
"""How long a lease holder must stay stopped before a wait for the lease gives up on it: a stop
that ends soon (job control's Ctrl-Z then ``bg``, a debugger or profiler pausing it for a moment)
is waited for like a running holder."""
FOLLOWER_TRUST_S = 0.5
"""How long reads trust a follower whose polls fall short of the log before they catch up (or
wait) themselves like a process without one, and say ``stale`` when that runs out."""
"""Seconds without new events after which a follower empties the WALs."""


class Projector:
    """Writes and heals the projections of one profile.

    ``profile_dir`` is ``$EVENTLOG_HOME/profiles/<name>``; ``log`` any :class:`eventlog.log.Log`.
    Thread-safe. Not usable across ``fork()``.
    """

    def __init__(self, profile_dir: str | os.PathLike[str], log: Log, profile_name: str | None = None, *,
                 batch_size: int = DEFAULT_BATCH, lease_timeout: float = DEFAULT_LEASE_TIMEOUT) -> None:
        directory = Path(profile_dir).absolute()
        files.make_dir(directory)
        if profile_name is None:
            named = getattr(log, "profile", None)
            profile_name = named if isinstance(named, str) else directory.name
        self.site = Site(directory, log, profile_name)
        self.lease_timeout = lease_timeout
        # The read-write connection (state.db with the FTS file attached) stays open across
        # catch-ups: it is only used under the lease, idle it holds no lock, and it is reopened
        # whenever a pointer names another generation. Reopening it per catch-up cost ~3 ms.
        self._writer = writer = Writer(self.site)
        self.lease = Lease(directory)
        self._catchup = CatchUp(self.site, writer, batch_size)
        self.extensions = ExtensionTables(self.site, writer)
        self._catchup.riders = self.extensions.in_step
        self._builder = Builder(self.site, writer, self.extensions)
        self._healer = Healer(self.site, writer, self._catchup, self._builder, self._locked)
        self._follower = Follower(directory, self._follow_step)
        self._busy_at = 0.0  # when the follower last saw the projections move
        self._behind_since: float | None = None  # since when the follower's polls fall short of the log
        self._wal_dirty = True  # WALs may hold pages (ours or another writer's) since the last truncation
        self._pointed: tuple[files.Generation | None, files.Generation | None] = (None, None)
        """The generations the follower saw the pointers name at its last idle poll."""
        self.visibility = Visibility(self)
        self._schema_use = SchemaUse(directory, SCHEMAS)
        self._probe: Reader | None = None
        self._probe_lock = threading.Lock()
        self._closed = False
        self._erase_checked = False  # see _erase_due_once

    @property
    def dir(self) -> Path:
        return self.site.dir

    @property
    def log(self) -> Log:
        return self.site.log

    @property
    def profile(self) -> str:
        return self.site.profile

    @property
    def batch_size(self) -> int:
        """Events per catch-up transaction."""
        return self._catchup.batch_size

    @batch_size.setter
    def batch_size(self, n: int) -> None:
        self._catchup.batch_size = max(1, int(n))

    def state_pointer(self) -> Path:
        """The symlink this process reads state.db through (see :mod:`projections.files`)."""
        return self.site.state_pointer()

    def fts_pointer(self) -> Path:
        return self.site.fts_pointer()

    # ---- the lease ---------------------------------------------------------------------------

    @contextmanager
    def _locked(self, timeout: float | None = None, *, others: float | None = None) -> Iterator[None]:
        """Hold the lease (waiting at most ``timeout``, default ``lease_timeout``, and at most
        ``others`` for another process; then :class:`LeaseError`)."""
        if self._closed:
            raise ProjectionError("the projector is closed")
        wait = self.lease_timeout if timeout is None else timeout
        if others is not None or (wait is not None and wait <= STOPPED_POLL_S):
            with self.lease.hold(wait, others=others):
                yield
            return
        self._acquire_unless_stopped(wait)
        try:
            yield
        finally:
            self.lease.release()

    def _acquire_unless_stopped(self, wait: float | None) -> None:
        """Take the lease, waiting at most ``wait`` seconds (None: without end), but not for a
        holder that is stopped (SIGSTOP, Ctrl-Z, a debugger): it holds the lease for as long as
        it stays stopped, and a command that needs the lease (a read whose state.db is missing
        or broken, a rebuild) hung for the whole ``lease_timeout`` (120 s). Raises
        :class:`LeaseError` naming the holder once it has stayed stopped for
        :data:`STOPPED_GRACE_S` (a holder resumed sooner is waited for as before)."""
        deadline = None if wait is None else time.monotonic() + wait
        stopped: tuple[int, float] | None = None  # (holder, first seen stopped) of this stop
        while True:
            step = STOPPED_POLL_S if deadline is None else min(STOPPED_POLL_S, max(0.0, deadline - time.monotonic()))
            if self.lease.acquire(step):
                return
            holder = self.lease_holder()
            now = time.monotonic()
            if holder is not None and holder != os.getpid() and process_state(holder) == "stopped":
                if stopped is None or stopped[0] != holder:
                    stopped = (holder, now)
                if now - stopped[1] >= STOPPED_GRACE_S or (deadline is not None and now >= deadline):
                    raise LeaseError(
                        f"process {holder} holds the projector lease {self.lease.path} and is stopped",
                        hint=f"resume or end that process (`kill -CONT {holder}`), then retry")
            else:
                stopped = None  # resumed (or another holder): a later stop starts its own grace
            if deadline is not None and now >= deadline:
                raise LeaseError(
                    f"another process has held the projector lease {self.lease.path} for over {wait} s",
                    hint="a long rebuild may be running; retry later or check `eventlog doctor`")

    # ---- bring up to date --------------------------------------------------------------------

    def advance(self, to_seq: int | None = None, *, wait: float = 0.0) -> Reach:
        """Bring the projections up to the log: make them include event ``to_seq`` (None: the
        log head as of this call).

        Whenever the lease is free this call applies the log itself — everything the log holds
        by then, so one catch-up serves every waiter — healing what it trips over (see
        :mod:`projections.heal`). While another thread or process holds the lease it watches
        the cursor that holder advances instead. ``wait``: seconds to keep trying; 0 (the
        default) makes one attempt and never waits. Returns a :class:`Reach`: ``done`` is
        False when ``wait`` ran out first. Which seq a read needs and how long it may wait is
        decided in :mod:`projections.visibility`.
        """
        target = self.log.head()[0] if to_seq is None else to_seq
        deadline = time.monotonic() + max(0.0, wait)
        delay = 0.0005
        # A damaged log or a full disk ends the wait at once: waiting cannot help (site.damage,
        # site.halt; the read says why).
        while not self._attempt(target) and time.monotonic() < deadline and not self.site.halt:
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        return Reach(target, self.site.known_seq)

    def _attempt(self, target: int) -> bool:
        site = self.site
        if site.known_seq >= site.reachable(target):
            return True
        site.known_seq = max(site.known_seq, self.cursor())  # another thread or process may have applied it
        if site.known_seq >= site.reachable(target) and not self._erase_due_once():
            return True
        if not self._closed and self.lease.acquire(0):
            try:
                self._healer.catch_up()
                self.extensions.catch_up()
            finally:
                self.lease.release()
        return site.known_seq >= site.reachable(target)

    def _erase_due_once(self) -> bool:
        """On this process's first read only: whether state.db applied an erase record that no
        purge has followed (its purger was SIGKILLed; see :meth:`Healer._purge`), so that this
        read takes the catch-up path, which purges, even though the cursor is at the head."""
        if self._erase_checked:
            return False
        self._erase_checked = True
        return bool(self.probe_reader()._run(lambda db: erase_due(read_meta(db))))

    def cursor(self) -> int:
        """The seq every projection in use has reached (state.db, and the FTS index unless
        search is degraded), read from the files. Read-only."""
        state_seq, fts_seq = self.probe_reader().cursors()
        if fts_seq is None or self.site.fts_fault:
            return int(state_seq)
        return int(min(state_seq, fts_seq))

    # ---- heal and rebuild ---------------------------------------------------------------------

    def health(self, full: bool = True) -> dict[str, Any]:
        """The projections' health; reads only (see :meth:`projections.heal.Healer.health`)."""
        return self._healer.health(full)

    def fault(self, e: sqlite3.Error, action: str) -> tuple[bool, Exception]:
        """What an SQLite error met while ``action`` means to a layer that may not classify it
        itself (the session facade): whether :meth:`heal` may mend it (a damaged, missing or
        unusable file: never a full disk or a read-only file system), and the typed error to
        raise when it may not (:func:`projections.db.converted`)."""
        return sql.is_fault(e, self.dir), sql.converted(e, action)

    def heal(self, full: bool = False, timeout: float | None = None, catch_up: bool = True) -> dict[str, Any]:
        """Detect and repair: rebuild whatever is not healthy, then bring the projections up
        to the log as a read would (:meth:`Visibility.before_read`; healthy but behind and
        not ``catch_up``: left to the next read). ``full`` adds the deep
        integrity checks (slower: reads every page). Waits for the lease only when something
        must be repaired (at most ``timeout``, default ``lease_timeout``; then
        :class:`LeaseError`). Returns the health after repair."""
        self.collect_superseded()
        h = self.health(full=full)
        if h["ok"]:
            if catch_up and (h["state"]["status"] == "stale" or h["fts"]["status"] == "stale"):
                self.visibility.before_read()
            return h
        search_only = h["state"]["status"] in HEALTHY
        try:
            # Only the search index to repair, and another process holds the lease (a stopped
            # gateway, a long rebuild): do not wait for it. Search is degraded (a scan) and the
            # index is rebuilt once the lease is free; transcripts are read and written meanwhile.
            with self._locked(timeout, others=0.0 if search_only else None):
                self._healer.repair(full)
        except LeaseError:
            if not search_only:
                raise
            # (health() noted the fault: this process's searches scan, and its next catch-up
            # under the lease rebuilds the index)
            if catch_up:
                self.visibility.before_read()
        return self.health(full=False)

    def collect_superseded(self) -> list[str]:
        """After a hot update: remove older program versions' private files once no process of
        that version is left (see :mod:`projections.files`). Never waits."""
        return self._healer.collect_superseded()

    def rebuild(self, which: str = "all", until_seq: int | None = None, as_of_ns: int | None = None,
                out_path: str | os.PathLike[str] | None = None, progress: Progress | None = None, *,
                timeout: float | None = None) -> dict[str, Any]:
        """Rebuild from the log into new files and swap them in (``which``: all|state|fts).

        ``until_seq``/``as_of_ns`` stop at that seq / before the first event appended after
        that time (a log prefix either way). ``out_path``: write one standalone file holding
        state and FTS tables instead (for audits; the live projections are not touched and no
        lease is needed). ``progress(done, total)`` is called as events are applied.
        Returns ``{"which", "events", "seconds", "events_per_s", "last_seq", "files"}``.
        """
        if which not in ("all", "state", "fts"):
            raise ValueError(f"which must be all, state or fts, not {which!r}")
        started = time.perf_counter()
        if out_path is not None:
            try:
                stats = self._builder.standalone(Path(out_path), until_seq, as_of_ns, progress)
                self.extensions.build_into(Path(out_path).absolute())
            except (sqlite3.Error, OSError) as e:  # the output's disk (full, read-only): one typed error
                err = sql.converted(e, f"writing the snapshot {out_path}")
                if not isinstance(err, DiskFullError):  # about the output, not the profile's files
                    err.hint = "write the snapshot into a writable folder of a regular file system"
                raise err from e
        else:
            with self._locked(timeout):
                stats = {"events": 0, "last_seq": None, "files": []}
                if which in ("all", "state"):
                    stats.update(self._builder.rebuild_state(until_seq, as_of_ns, progress, with_fts=which == "all"))
                    if until_seq is None and as_of_ns is None:
                        self.extensions.catch_up()  # the new file's extension tables, from the log
                else:
                    f = self._builder.rebuild_fts()
                    stats.update(events=f["documents"], last_seq=f["last_seq"], files=f["files"])
        seconds = time.perf_counter() - started
        stats.pop("last_hash", None)
        stats.update(which=which, seconds=seconds, events_per_s=stats["events"] / seconds if seconds > 0 else 0.0)
        return stats

    def purge(self, timeout: float | None = None, *, after: int | None = None) -> dict[str, Any]:
        """After an erase: rebuild state.db and the FTS index into new generation files (built
        from the log, where the erased content is gone), then remove every other generation of
        this program's projections with its WAL and shared-memory files, so that no file under the
        profile keeps what was erased (a process still reading an old file keeps its open copy
        until it lets go; the name is gone). Waits for the lease at most ``timeout``.

        ``after``: the seq of the erase being cleaned up; when state.db was built from the whole
        log at or after it (a catch-up that met the erase record purged already, see
        :meth:`Healer._purge`), only the other generations are removed."""
        started = time.perf_counter()
        with self._locked(timeout):
            try:
                built_at = self._built_at()
                if after is not None and built_at is not None and built_at >= after:
                    built = {"events": 0, "files": []}
                else:
                    built = self._builder.rebuild_state(with_fts=True)
                    self.extensions.catch_up()
                removed = files.remove_replaced(self.dir, SCHEMAS)
            except (sqlite3.Error, OSError) as e:  # a full disk above all: typed, as every projection error
                raise sql.converted(e, "purging the projections after an erase") from e
        return {"events": built["events"], "files": built["files"], "removed": removed,
                "seconds": time.perf_counter() - started}

    def _built_at(self) -> int | None:
        """The log seq up to which the current state.db was built from the whole log, when it
        has applied no erase record since (None: unknown, or an erase is due). Lease held."""
        try:
            meta = read_meta(self._writer.state())
        except (Broken, sqlite3.Error):
            return None
        built = meta.get("rebuilt_at")
        return built if isinstance(built, int) and not erase_due(meta) else None

    # ---- extension read models ------------------------------------------------------------------

    def register_read_models(self, models: dict[str, Any], upcast: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Build and keep current these extension read models, the whole set (one left out is no
        longer kept; see :mod:`projections.extensions`)."""
        self.extensions.register(models, upcast)

    def read_model_broken(self, name: str) -> str | None:
        """Why extension read model ``name`` is broken (its extension failed on an event), or None."""
        return self.extensions.broken.get(name)

    def advance_read_model(self, name: str, to_seq: int, wait: float = 30.0) -> None:
        """Return once extension read model ``name`` includes event ``to_seq``, catching its tables
        up under the lease whenever it is free; :class:`ProjectionError` after ``wait`` seconds,
        or when the read model is not registered or broken."""
        rm = self.extensions.models.get(name)
        if rm is None:
            raise ProjectionError(f"no read model {name!r} is registered", hint="open the store with its extension")
        deadline = time.monotonic() + wait
        delay = 0.0005
        while True:
            if name in self.extensions.broken:
                raise ProjectionError(f"read model {name!r} is broken: {self.extensions.broken[name]}",
                                      hint="fix the extension, then open a new store (its tables are rebuilt)")
            reached = self.probe_reader()._run(lambda db: extension_cursor(db, name, rm.version))
            if reached >= self.site.reachable(to_seq):  # never past a damaged event (projections.verified)
                return
            if not self._closed and self.lease.acquire(0):
                try:
                    self._healer.catch_up()
                    self.extensions.catch_up()
                finally:
                    self.lease.release()
                continue
            if time.monotonic() >= deadline:
                raise ProjectionError(f"read model {name!r} did not reach seq {to_seq} in time",
                                      hint="another process holds the projector lease; retry, or run `eventlog doctor`")
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    @contextmanager
    def read_model(self, name: str, to_seq: int, wait: float = 30.0) -> Iterator[sqlite3.Connection]:
        """A read-only connection on state.db once extension read model ``name`` includes event
        ``to_seq`` (see :meth:`advance_read_model`)."""
        self.advance_read_model(name, to_seq, wait)
        held, g = files.hold_pointed(self.state_pointer())
        if g is None:
            raise ProjectionError("state.db is missing", hint="run `eventlog doctor --fix`")
        try:
            conn = sql.connect_ro(g.path)
            try:
                yield conn
            finally:
                conn.close()
        finally:
            files.release(held, g)

    # ---- search faults (reported by readers) ----------------------------------------------------

    def report_fts_fault(self, error: BaseException | str) -> None:
        """A search hit an FTS fault: search is degraded until the index alone is checked and
        rebuilt (in the background; see :meth:`projections.heal.Healer.report_fts_fault`)."""
        self._healer.report_fts_fault(error)

    @property
    def search_degraded(self) -> bool:
        return bool(self.site.fts_fault)

    # ---- following ----------------------------------------------------------------------------

    def _follow_step(self) -> None:
        """One poll of the follower: advance; once nothing has moved for :data:`IDLE_S`, empty
        the WALs (:meth:`truncate_wal`), retried every ``IDLE_S`` until it succeeds."""
        before = self.site.known_seq
        reach = self.advance(wait=0)
        now = time.monotonic()
        self._behind_since = None if reach.done else (self._behind_since or now)
        if self.site.known_seq != before:
            self._busy_at, self._wal_dirty = now, True
        elif self._wal_dirty and now - self._busy_at >= IDLE_S:
            self._busy_at = now
            self._wal_dirty = not self.truncate_wal()
        else:
            pointed = (files.read_pointer(self.state_pointer()), files.read_pointer(self.fts_pointer()))
            if pointed != self._pointed and self._let_go_replaced():
                self._pointed = pointed  # (not let go: tried again at the next idle poll)

    def _let_go_replaced(self) -> bool:
        """After another process's rebuild swapped a pointer: move this process's connections to
        the new generations, so that the replaced files go now rather than at its next read,
        write or close (an idle gateway kept a whole state.db and its WAL). Never waits for the
        lease: False when the write connection is still on a replaced generation because the
        lease was taken (the rebuilding process still holds it right after its swap; a follower
        that took that for done kept the old files until it next wrote)."""
        self.cursor()  # the probe reader (the store's reads) reopens on what the pointers name
        if not self._writer.replaced() or self._closed:
            return True
        if not self.lease.acquire(0):
            return False
        try:
            if self._writer.replaced():
                self._writer.close()
            return True
        finally:
            self.lease.release()

    def truncate_wal(self) -> bool:
        """Checkpoint the projections' WALs and cut them to zero bytes, if the lease is free
        now and no reader is inside a read transaction (never waits; see
        :meth:`projections.catchup.Writer.truncate_wal`). True when they are empty."""
        if self._closed or not self.lease.acquire(0):
            return False
        try:
            return self._writer.truncate_wal()
        except (Broken, sqlite3.Error):
            return False  # a damaged file: the next catch-up or heal deals with it
        finally:
            self.lease.release()

    def start_follower(self, poll: float = FOLLOW_POLL) -> None:
        """Start a daemon thread that advances the projections every ``poll`` seconds whenever
        this process can take the lease (idempotent; see :mod:`projections.follow`). Reads trust
        it once a poll of it has reached the log (:meth:`follower_keeps_up`)."""
        if not self._follower.running:
            self._behind_since = 0.0  # not known to keep up until a poll reaches the log
        self._follower.start(poll)

    def stop_follower(self) -> None:
        self._follower.stop()

    def skipped_types(self) -> dict[str, int]:
        """Events the core tables did not project, by type (a newer program's types, extensions'),
        counted since state.db was built. Reads the file as it stands and never heals it (the
        doctor asks this before any repair): ``{}`` when state.db is missing or unreadable."""
        g = files.read_pointer(self.state_pointer())
        if g is None:
            return {}
        try:
            db = sql.connect_ro(g.path)
            try:
                row = db.execute("SELECT value FROM meta WHERE key = 'skipped_types'").fetchone()
            finally:
                db.close()
            found = json.loads(row[0]) if row and isinstance(row[0], str) else {}
            return {str(k): int(v) for k, v in found.items()} if isinstance(found, dict) else {}
        except (sqlite3.Error, ValueError, TypeError, AttributeError):
            return {}

    def lease_holder(self) -> int | None:
        """The pid of the process holding the projector lease, if any (Linux; else None)."""
        return flock_holder(self.lease.path.parent) if not self.lease.held else os.getpid()

    @property
    def following(self) -> bool:
        """This process runs this projector's follower."""
        return self._follower.running

    def follower_keeps_up(self) -> bool:
        """This process's follower runs and its polls have reached the log within the last
        :data:`FOLLOWER_TRUST_S` (a lease holder that is stopped, or a full disk, keeps it short)."""
        behind = self._behind_since
        return (self._follower.running and not self._follower.failures and not self.site.halt
                and (behind is None or time.monotonic() - behind < FOLLOWER_TRUST_S))

    # ---- readers and lifetime --------------------------------------------------------------------

    def probe_reader(self) -> Reader:
        """The reader this projector checks its cursor through (created once, closed with the
        projector); the projections read model queries through it too."""
        with self._probe_lock:
            if self._probe is None:
                from projections.queries import Reader
                self._probe = Reader(self)
            return self._probe

    def reader(self) -> Reader:
        """A new :class:`projections.queries.Reader` on this profile's projections."""
        from projections.queries import Reader
        return Reader(self)

    def close(self) -> None:
        if self._closed:
            return
        self.stop_follower()
        self._healer.close()
        if self._probe is not None:
            self._probe.close()
        if self._writer.open:
            self.truncate_wal()  # this process wrote: leave no WAL behind (other processes may read on)
        self._closed = True
        self.lease.close()
        self._writer.close()  # the follower and the repairer are stopped: nobody works under the lease
        self._schema_use.close()

    def __enter__(self) -> Projector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Projector", "Reach", "LeaseError", "ProjectionError"]
