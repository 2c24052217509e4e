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
import sqlite3
import threading
from contextlib import AbstractContextManager
from typing import Any, Callable

from eventlog.errors import LeaseError, ProjectionError
from projections import db as sql
from projections import files
from projections.build import Builder
from projections.catchup import CatchUp, Writer
from projections.health import HEALTHY, fts_command_check, inspect
from projections.site import SCHEMAS, Broken, Site, report

log = logging.getLogger("eventlog.projections")

REPAIR_LEASE_WAIT = 2.0  # a background FTS repair gives up if the lease stays busy; the next search retries
Locked = Callable[[float | None], AbstractContextManager[None]]


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
        """``{"ok": bool, "state": {...}, "fts": {...}}`` where each part has ``status`` (see
        :mod:`projections.health`), ``detail``, ``file``, ``generation``, ``last_seq``,
        ``log_head``; ``fts["degraded"]`` tells whether search runs on the fallback scan.
        Reads only: never rebuilds, never takes a write lock."""
        site = self.site
        view = site.view()
        state = inspect(site.state_pointer(), "state", profile=site.profile, log=view, full=full)
        state_seq = state["last_seq"] if state["status"] in HEALTHY else None
        ftsh = inspect(site.fts_pointer(), "fts", profile=site.profile, log=view, full=full, state_seq=state_seq)
        fault = site.fts_fault
        ftsh["degraded"] = bool(fault) or ftsh["status"] not in HEALTHY
        if fault and ftsh["status"] in HEALTHY:
            ftsh["detail"] = f"search failed in this process: {fault}"
        return {"ok": state["status"] in HEALTHY and ftsh["status"] in HEALTHY and not fault,
                "state": state, "fts": ftsh}

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
        sees it can search. Returns the number of events applied to state.db."""
        applied = 0
        for attempt in (1, 2):
            try:
                applied = self.catchup.apply()
                break
            except (Broken, sqlite3.DatabaseError) as e:
                if isinstance(e, sqlite3.DatabaseError) and not sql.is_fault(e):
                    raise
                if attempt == 2:
                    raise ProjectionError(f"state.db is still unusable after a rebuild: {e}") from e
                report("state", {"status": getattr(e, "status", "corrupt"), "detail": str(e)})
                self.writer.close()
                self.builder.rebuild_state(with_fts=files.read_pointer(self.site.fts_pointer()) is None)
        try:
            self.catchup.sync_fts()
        except (Broken, sqlite3.DatabaseError) as e:
            # The index is derived: rebuilding it alone is always safe, whatever SQLite said.
            report("fts", {"status": getattr(e, "status", "corrupt"), "detail": str(e)})
            self.site.fts_fault = str(e)
            self.writer.detach_fts()
            self.builder.rebuild_fts()
        self.site.known_seq = self.catchup.cursor()
        return applied

    def repair(self, full: bool) -> None:
        """Inspect both files (``full``: integrity checks too), rebuild what is not healthy,
        then catch up."""
        site = self.site
        view = site.view()
        state = inspect(site.state_pointer(), "state", profile=site.profile, log=view, full=full)
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
