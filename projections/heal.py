"""Heal: find what is wrong with the projections and rebuild exactly that.

A projection that is missing, unreadable, corrupt, foreign (another log or profile), ahead of
the log or of an older schema is rebuilt into a new generation (:mod:`projections.build`).
state.db and the FTS index are judged apart: an FTS fault is its own class — search is
degraded (answered by a scan of state.db) until the index *alone* is rebuilt, and transcripts
are never touched for it.

Two ways in: :meth:`Healer.repair` inspects both files first (what ``Projector.heal`` and
``doctor --fix`` run), and :meth:`Healer.catch_up` heals whatever a catch-up trips over. Both
run under the projector lease. :meth:`Healer.health` only reads.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable

from eventlog.errors import LeaseError, ProjectionError
from eventlog.log import damage as log_damage
from projections import db as sql
from projections import files, space
from projections.build import Builder
from projections.catchup import CatchUp, Writer
from projections.health import HEALTHY, WAITING, fts_command_check, inspect
from projections.site import SCHEMAS, Broken, Site, report

log = logging.getLogger("eventlog.projections")

REPORTED = {"eventlog_cli_reported": True}
"""Marks a log record a read's own output states too (the CLI prints it once)."""
REPAIR_LEASE_WAIT = 2.0  # a background FTS repair gives up if the lease stays busy; the next search retries
Locked = Callable[[float | None], AbstractContextManager[None]]


class _NoRoom(Exception):
    """No room to rebuild (the file system is full or read-only); the reason is the message."""


class Healer:
    """Health checks and repairs of one profile's projections.

    ``locked(timeout)`` takes the projector lease (the background FTS repair needs it)."""

    def __init__(self, site: Site, writer: Writer, catchup: CatchUp, builder: Builder, locked: Locked) -> None:
        self.site = site
        self.writer = writer
        self.catchup = catchup
        self.builder = builder
        self._locked = locked
        self._repairer: threading.Thread | None = None
        self._repair_lock = threading.Lock()
        self._closed = False

    # ---- read-only ------------------------------------------------------------------------------

    def health(self, full: bool = True) -> dict[str, Any]:
        """``{"ok": bool, "state": {...}, "fts": {...}, "damage", "halt"}`` where each part has
        ``status`` (see :mod:`projections.health`), ``detail``, ``file``, ``generation``,
        ``last_seq``, ``log_head``; ``fts["degraded"]`` tells whether search runs on the
        fallback scan. ``damage``: the log's first bad seq known to this process or recorded
        (``{"seq", "reason"}``; the projections stop before it), ``halt``: why they cannot be
        written now (a full disk). Reads only: never rebuilds, never takes a write lock."""
        site = self.site
        view = site.view()
        for _ in range(3):
            state = inspect(site.state_pointer(), "state", profile=site.profile, log=view, full=full)
            state_seq = state["last_seq"] if state["status"] in HEALTHY else None
            ftsh = inspect(site.fts_pointer(), "fts", profile=site.profile, log=view, full=full, state_seq=state_seq)
            # Read without the lease, one file after the other: an index "ahead" of the state
            # cursor read before it may only have been caught up (with state.db) in between.
            if ftsh["status"] != "ahead":
                break
        if ftsh["status"] not in HEALTHY + WAITING and state["status"] in HEALTHY and not site.fts_fault:
            # Learnt here, so this process's searches scan until the index is rebuilt alone.
            site.fts_fault = f"{ftsh['status']}: {ftsh['detail']}"
        fault = site.fts_fault
        ftsh["degraded"] = bool(fault) or ftsh["status"] not in HEALTHY
        if fault and ftsh["status"] in HEALTHY:
            ftsh["detail"] = f"search failed in this process: {fault}"
        damage = site.damage or log_damage.recorded(site.log)
        return {"ok": state["status"] in HEALTHY and ftsh["status"] in HEALTHY and not fault,
                "state": state, "fts": ftsh, "damage": damage.to_dict() if damage is not None else None,
                "halt": site.halt}

    def collect_superseded(self) -> list[str]:
        """After a hot update: remove the private pointers (and their files) of older program
        versions once no process of that version is left. Cheap when there are none (one
        directory listing); never waits."""
        removed = files.collect_superseded(self.site.dir, SCHEMAS)
        if removed:
            log.info("removed files of older program versions: %s", ", ".join(removed))
        return removed

    # ---- lease held -------------------------------------------------------------------------------

    def catch_up(self) -> int:
        """Catch up (:class:`projections.catchup.CatchUp`), rebuilding what it finds broken:
        state.db (with the index too when there is none), or the index alone. Then publish the
        cursor as ``site.known_seq`` — only now, with the index in step too, so a thread that
        sees it can search. Returns the number of events applied to state.db.

        A full disk or a read-only file system is never taken for damage: nothing is rebuilt,
        ``site.halt`` says why, and the projections serve what they hold until a later
        catch-up finds room. Events past a damaged one are never applied (``site.damage``)."""
        site = self.site
        why = space.read_only_reason(site.dir)
        if why is not None:
            return self._halt(why)
        damage = site.damage
        try:
            applied = self._catch_up()
        except _NoRoom as e:
            return self._halt(str(e))
        except Exception as e:
            why = space.out_of_room(e, site.dir)
            if why is None:
                raise
            return self._halt(why, e)
        if site.halt is not None:
            log.warning("the projections are written again (%s is over)", site.halt)
            site.halt = None
        if site.damage is not None and site.damage != damage:
            log.error("the log is damaged at seq %d (%s): the projections stop before it",
                      site.damage.seq, site.damage.reason, extra=REPORTED)
        return applied

    def _halt(self, why: str, error: BaseException | None = None) -> int:
        """Stop writing the projections for now (no room): the next catch-up tries again."""
        if self.site.halt != why:
            log.warning("the projections cannot be written (%s)%s; reads serve what they hold",
                        why, f": {error}" if error is not None else "", extra=REPORTED)
        self.site.halt = why
        self.writer.close()
        return 0

    def _catch_up(self) -> int:
        # state.db can go bad at any step, not only while the log is applied to it (a user's
        # `rm state.db` or an overwrite between two steps): wherever it does, it is rebuilt and
        # the steps are taken again. The cursor read and the index's sync used to let a missing
        # state.db out as an internal error, or blame the index for it (outside audit, helper-67).
        for attempt in (1, 2):
            try:
                applied = self.catchup.apply()
                self._sync_fts()
                if self.catchup.erase_due:
                    self._purge(self.catchup.erase_due)
                self.site.known_seq = self.catchup.cursor()
                return applied
            except (Broken, sqlite3.DatabaseError) as e:
                self._no_room(e)
                if isinstance(e, sqlite3.DatabaseError) and not sql.is_fault(e, self.site.dir):
                    raise
                if attempt == 2:
                    raise ProjectionError(f"state.db is still unusable after a rebuild: {e}") from e
                self._room_to_rebuild()
                report("state", {"status": getattr(e, "status", "corrupt"), "detail": str(e)})
                self.writer.close()
                self._clear_way()
                self.builder.rebuild_state(with_fts=files.read_pointer(self.site.fts_pointer()) is None)
        raise AssertionError("unreachable")

    def _sync_fts(self) -> None:
        """Bring the index up to state.db, rebuilding the index alone when it is what failed."""
        try:
            self.catchup.sync_fts()
        except (Broken, sqlite3.DatabaseError) as e:
            self._no_room(e)
            fault = self._state_fault()
            if fault is not None:
                raise fault from e  # state.db itself (gone, overwritten): rebuilt as such, not the index
            self._room_to_rebuild()
            # The index is derived: rebuilding it alone is always safe, whatever SQLite said.
            report("fts", {"status": getattr(e, "status", "corrupt"), "detail": str(e)})
            self.site.fts_fault = str(e)
            self.writer.detach_fts()
            self._clear_way()
            self.builder.rebuild_fts()

    def _state_fault(self) -> Broken | None:
        """Why state.db cannot be used now (its pointer, its file, its meta table), or None."""
        try:
            self.catchup.cursor()
        except Broken as e:
            return e
        except sqlite3.DatabaseError as e:
            if not sql.is_fault(e, self.site.dir):
                raise
            return Broken(sql.status_of(e), str(e))
        return None

    def _purge(self, seq: int) -> None:
        """state.db has applied erase record ``seq`` that another process (a Hermes facade,
        another PostgreSQL host, an eraser with no projector) wrote: the rows are gone, but the
        index's segments, freed pages and WALs may still hold the words. Build both files again
        from the log, where the erased content is gone, and remove every other generation — what
        the erasing process's :meth:`Projector.purge` does. A catch-up that cannot finish it
        (no room) leaves ``erase_applied`` above ``rebuilt_at``, so the next one tries again."""
        self._room_to_rebuild()
        log.info("erase at seq %d applied: purging the projections", seq)
        self.writer.close()
        self.builder.rebuild_state(with_fts=True)
        files.remove_replaced(self.site.dir, SCHEMAS)
        self.catchup.erase_due = 0

    def repair(self, full: bool) -> None:
        """Inspect both files (``full``: integrity checks too), rebuild what is not healthy,
        then catch up. Nothing is rebuilt while the file system is full or read-only
        (``site.halt`` says so)."""
        site = self.site
        why = space.cannot_write(site.dir)
        if why is not None:
            self._halt(why)
            return
        try:
            self._repair(full)
        except Exception as e:
            why = space.out_of_room(e, site.dir)
            if why is None:
                raise
            self._halt(why, e)

    def _repair(self, full: bool) -> None:
        site = self.site
        view = site.view()
        state = inspect(site.state_pointer(), "state", profile=site.profile, log=view, full=full)
        self._clear_way()
        if state["status"] not in HEALTHY:
            report("state", state)
            ftsh = inspect(site.fts_pointer(), "fts", profile=site.profile, log=view)
            both = ftsh["status"] not in HEALTHY
            if both:
                report("fts", ftsh)
            self.builder.rebuild_state(with_fts=both)
            state = inspect(site.state_pointer(), "state", profile=site.profile, log=view)
        ftsh = inspect(site.fts_pointer(), "fts", profile=site.profile, log=view, full=full,
                       state_seq=state["last_seq"])
        problem = None if ftsh["status"] in HEALTHY else f"{ftsh['status']} ({ftsh['detail']})"
        if problem is None and full:
            problem = self._fts_command_check()
        if problem is None and site.fts_fault:
            problem = site.fts_fault
        if problem is not None:
            report("fts", {"status": ftsh["status"], "detail": problem})
            self.writer.close()
            self.builder.rebuild_fts()
        self.catch_up()

    def _no_room(self, e: BaseException) -> None:
        """Raise :class:`_NoRoom` when ``e`` (or the error behind a :class:`Broken`) is a full
        disk or a read-only file system, not damage."""
        for error in (e, e.__cause__):
            why = space.out_of_room(error, self.site.dir) if error is not None else None
            if why is not None:
                raise _NoRoom(why) from e

    def _room_to_rebuild(self) -> None:
        """Raise :class:`_NoRoom` when a rebuild could only start and die (a full disk)."""
        why = space.cannot_write(self.site.dir)
        if why is not None:
            raise _NoRoom(why)

    def _clear_way(self) -> None:
        """A directory or a plain file standing where a pointer belongs (``state.db``, ``fts.db``:
        another program's database, a copy put there by hand) is set aside before a rebuild swaps
        the pointer in: a directory removed when empty, an empty file left for the swap to replace,
        anything else renamed ``<name>.displaced.<n>`` (never deleted; ``eventlog doctor`` lists it)."""
        for pointer in (self.site.state_pointer(), self.site.fts_pointer()):
            if os.path.islink(pointer):
                continue
            if os.path.isdir(pointer) or (os.path.isfile(pointer) and os.path.getsize(pointer) > 0):
                set_aside(pointer)

    def _fts_command_check(self) -> str | None:
        g = files.read_pointer(self.site.fts_pointer())
        if g is None:
            return "missing"
        try:
            conn = sql.connect_rw(g.path)
        except sqlite3.Error as e:
            return str(e)
        try:
            conn.execute("BEGIN IMMEDIATE")
            return fts_command_check(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    # ---- a search failed ------------------------------------------------------------------------------

    def report_fts_fault(self, error: BaseException | str) -> None:
        """Search is degraded (answered by a scan) until the index is checked and, if broken,
        rebuilt alone — by a background thread started here, or by the next catch-up or
        repair."""
        first = not self.site.fts_fault
        self.site.fts_fault = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        if first:
            log.warning("search degraded: %s", self.site.fts_fault)
        with self._repair_lock:
            if self._closed or (self._repairer is not None and self._repairer.is_alive()):
                return
            self._repairer = threading.Thread(target=self._repair_fts, name="eventlog-fts-repair", daemon=True)
            self._repairer.start()

    def _repair_fts(self) -> None:
        try:
            with self._locked(REPAIR_LEASE_WAIT):
                if self.site.fts_fault:
                    self.catch_up()
        except LeaseError:
            pass
        except Exception:  # the next search reports again; Projector.heal() raises with details
            log.exception("repairing the FTS index failed")

    def close(self) -> None:
        """Start no more background repairs; wait for a running one."""
        with self._repair_lock:
            self._closed = True
            repairer = self._repairer
        if repairer is not None:
            repairer.join()


def set_aside(path: Path) -> str:
    """Remove the empty directory ``path``, or rename it (or the file ``path``)
    ``<name>.displaced.<n>`` (0700, a file 0600); returns what became of it."""
    is_dir = os.path.isdir(path)
    try:
        if is_dir:
            os.rmdir(path)
            log.warning("removed the empty directory %s that stood where a projection pointer belongs", path)
            return "removed"
    except OSError:
        pass
    n = 1
    while os.path.lexists(path.with_name(f"{path.name}.displaced.{n}")):
        n += 1
    aside = path.with_name(f"{path.name}.displaced.{n}")
    os.rename(path, aside)
    os.chmod(aside, files.DIR_MODE if is_dir else files.FILE_MODE)
    log.warning("moved the %s %s that stood where a projection pointer belongs to %s",
                "directory" if is_dir else "file", path, aside.name)
    return f"moved to {aside.name}"
