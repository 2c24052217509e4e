"""SessionStore: the facade an agent runtime talks to.

Writes validate their input (``eventlog.events``), check the domain rules they can check up
front against the current read model, and append events to the profile's log. Reads query a
read model with read-your-writes for the calling process: the SQLite projections when they are
available, else the in-memory reference fold caught up from the log.

Thread-safe: one store may be shared by every thread of a gateway; concurrent appends share
commits (group commit in :class:`eventlog.log.EventLog`).
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol

from eventlog.errors import (
    ClosedError,
    ConcurrencyError,
    ConflictError,
    DiskFullError,
    EarlierProcessError,
    EventLogError,
    NotFoundError,
    ProjectionError,
    StorageError,
    TitleConflictError,
    ValidationError,
    WriterBusyError,
    process_state,
)
from eventlog.log import LOG_URL_ENV, Log, open_log
from eventlog.log.base import erase_record_room, prepare_batch
from eventlog.log.codec import new_id
from eventlog.log.damage import refuse_if_damaged
from eventlog.log.filesystem import refuse_network
from eventlog.profiles import (
    DEFAULT_PROFILE,
    denied,
    flock_holder,
    flock_until,
    open_private,
    path_text,
    profile_dir,
    refuse_lost_log,
    resolve_home,
    validate_profile,
)
from eventlog.sessions import events as ev
from eventlog.sessions import rules
from eventlog.sessions.fold import Fold, content_text
from eventlog.sessions.inputs import stream_life
from eventlog.sessions.reads import ReadModel, typed_read

if TYPE_CHECKING:
    from eventlog.sessions.extensions import Registry

_log = logging.getLogger("eventlog.sessions")

RULES_LOCK = "rules.lock"
"""The profile's lock file for check-then-append of the domain rules (see SessionStore._ruled)."""
RULES_LOCK_TIMEOUT = 10.0
"""How long a rule check waits for another process's, when the log has no lock timeout of its own."""
ERASE_LOCK = "erase.lock"
"""The profile's lock file held while an erase cleans the files after its record (compaction,
purge): a second erase, or its retry, that finds the record unfinished waits for it instead of
taking it for the work of a killed process (see SessionStore._erase_cleanup)."""
OPEN_READ_MODEL_WAIT = 1.0
"""Seconds an open waits for an extension's read model to reach the log behind another process's
catch-up (then it opens, and a read of the model waits as reads do)."""


ERASE_ROUNDS = 50
"""How many erase records one erase_session may take while other processes keep appending to the
session (each round erases what they appended before it; they are refused after the last)."""


class FoldReadModel:
    """The reference fold, caught up from the log before every read (in-process only)."""

    def __init__(self, log: Log) -> None:
        self._log = log
        self._fold = Fold(warn=True)
        self._seq = 0
        self._lock = threading.RLock()

    def advance(self, to_seq: int | None = None, wait: float | None = None) -> int:
        """Catch the fold up to the log head (it never waits: there is no lease to wait for)."""
        with self._lock:
            if self._seq >= (self._log.head()[0] if to_seq is None else to_seq):
                return self._seq
            for env in self._log.read(self._seq + 1):
                self._fold.apply(env)
                self._seq = env["seq"]
            return self._seq

    def close(self) -> None:
        pass

    def peek(self) -> "FoldReadModel":
        return self

    def _caught_up(self) -> Fold:
        """The fold, with every event of the log as of now applied (call with the lock held)."""
        self.advance()
        return self._fold

    # ---- helpers writers check before appending ----------------------------------------------

    def is_live(self, session_id: str) -> bool:
        with self._lock:
            return self._caught_up().is_live(session_id)

    def title_holder(self, title: str) -> str | None:
        with self._lock:
            return self._caught_up().title_holder(title)

    def titles(self) -> set[str]:
        with self._lock:
            return self._caught_up().titles()

    def message_session(self, message_id: int) -> str | None:
        with self._lock:
            return self._caught_up().message_session(message_id)

    def current_reaction(self, message_id: int, author: str) -> str | None:
        with self._lock:
            return self._caught_up().current_reaction(message_id, author)

    def lineage(self, session_id: str) -> list[str]:
        with self._lock:
            return self._caught_up().lineage(session_id)

    def unseen_reactions(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return self._caught_up().unseen_reactions(session_id)

    # ---- reads ---------------------------------------------------------------------------------

    @typed_read
    def get_session(self, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._caught_up().get_session(session_id)

    @typed_read
    def list_sessions(self, *, source: str | None = None, archived: bool | None = False,
                      pinned: bool | None = None, hidden: bool | None = False, children: bool = True,
                      workspace: str | None = None, limit: int | None = 50,
                      offset: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return self._caught_up().list_sessions(source=source, archived=archived, pinned=pinned, hidden=hidden,
                                                   children=children, workspace=workspace, limit=limit,
                                                   offset=offset)

    @typed_read
    def get_messages(self, session_id: str, *, include_inactive: bool = False, limit: int | None = None,
                     before: int | None = None, after: int | None = None,
                     newest_first: bool = False) -> list[dict[str, Any]]:
        with self._lock:
            return self._caught_up().get_messages(session_id, include_inactive=include_inactive, limit=limit,
                                                  before=before, after=after, newest_first=newest_first)

    @typed_read
    def get_usage(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return self._caught_up().get_usage(session_id)

    @typed_read
    def get_reactions(self, message_id: int) -> list[dict[str, Any]]:
        with self._lock:
            return self._caught_up().get_reactions(message_id)

    @typed_read
    def search(self, query: str, *, role: str | None = None, source: str | None = None,
               session_id: str | None = None, limit: int | None = 20) -> dict[str, Any]:
        """The projection's result shape, from the fold's matching messages (no index to degrade)."""
        with self._lock:
            hits = self._caught_up().search(query, role=role, source=source, session_id=session_id, limit=limit)
        return {"degraded": False, "results": [
            {"session_id": m["session_id"], "message_id": m["id"], "role": m["role"],
             "snippet": (content_text(m["content"]) or "")[:200], "timestamp": m["timestamp"]} for m in hits]}

    @typed_read
    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self._caught_up().stats()


class Projections(Protocol):
    """What SessionStore asks of the projector of the projection read model (rebuilds, health,
    the cursor); typed here so that the session layer never imports the projections."""

    def rebuild(self, which: str = "all", *, until_seq: int | None = None, as_of_ns: int | None = None,
                out_path: str | Path | None = None, progress: Any = None) -> dict[str, Any]: ...
    def health(self, full: bool = True) -> dict[str, Any]: ...
    def cursor(self) -> int: ...
    def register_read_models(self, models: dict[str, Any], upcast: Any) -> None: ...
    def read_model_broken(self, name: str) -> str | None: ...
    @property
    def following(self) -> bool: ...
    def read_model(self, name: str, to_seq: int, wait: float = 30.0) -> Any: ...
    def heal(self, full: bool = False, timeout: float | None = None, catch_up: bool = True) -> dict[str, Any]: ...
    def fault(self, e: sqlite3.Error, action: str) -> tuple[bool, Exception]: ...
    def purge(self, timeout: float | None = None, *, after: int | None = None) -> dict[str, Any]: ...
    def advance_read_model(self, name: str, to_seq: int, wait: float = 30.0) -> None: ...
    def start_follower(self) -> None: ...
    def stop_follower(self) -> None: ...
    def lease_holder(self) -> int | None: ...


def _pin_read_model(conn: sqlite3.Connection, name: str, version: int, target: int) -> sqlite3.Cursor | None:
    """Hold one read snapshot of ``conn`` (state.db) for as long as the returned cursor is open,
    when in it extension read model ``name`` is at ``version`` and holds event ``target``; None
    (and no snapshot held) when not.

    Two versions of one read model share its tables, and a process of the other version drops
    and rebuilds them whenever it catches up: each statement of the caller, reading at autocommit,
    could see them of the other version or just emptied. The snapshot is held by a statement left
    pending (stepped once, never finished), not by ``BEGIN``: the caller may begin and commit
    transactions of its own on the connection (the LangGraph saver does), and SQLite keeps a
    connection's read snapshot across them while one of its statements is pending."""
    pin = conn.execute("SELECT count(*) FROM meta -- eventlog: the read model's snapshot")
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN (?, ?)",
                                 (f"ext:{name}:version", f"ext:{name}:seq")).fetchall())
        seq = meta.get(f"ext:{name}:seq")
        if meta.get(f"ext:{name}:version") == version and type(seq) is int and seq >= target:
            return pin
    except BaseException:
        pin.close()
        raise
    pin.close()
    return None


def _check_reason(reason: Any) -> str:
    """An erase's ``reason`` (the audit record's): a non-empty text of at most MAX_SHORT (1,024)
    characters, the limit of ``session.ended``'s reason and every other short text; returned
    with lone surrogates as U+FFFD, as every text is stored."""
    if not isinstance(reason, str) or not reason.strip() or len(reason) > rules.MAX_SHORT:
        raise ValidationError("reason", f"must be a non-empty text of at most {rules.MAX_SHORT} characters")
    return rules.clean_text(reason)


def _erase_view(env: dict[str, Any]) -> dict[str, Any]:
    """What an erase reads of an event of the streams it erases: its place, type and whether it
    is erased, and the data of a creation (its parent). Holding the envelopes whole, a session of
    200,000 messages took 2 GB to erase (outside audit, helper-87)."""
    view = {k: env.get(k) for k in ("seq", "session", "type", "erased")}
    view["data"] = env.get("data") if env.get("type") == "session.created" else None
    return view


def _check_by(by: Any) -> str:
    """An erase's ``by`` (who, for the audit record): the OS user when None, else checked as
    ``reason`` is. It was stored as given: a number, a list, an empty or a megabyte text in the
    audit record, or an erase refused as too large naming an internal field (outside audit,
    helper-52)."""
    if by is None:
        return _user()
    if not isinstance(by, str) or not by.strip() or len(by) > rules.MAX_SHORT:
        raise ValidationError("by", f"must be a non-empty text of at most {rules.MAX_SHORT} characters (or None: "
                                    "the OS user)")
    return rules.clean_text(by)


def _cleanup_failed(seq: int, e: Exception) -> EventLogError:
    """The error for an erase whose record is committed but whose cleanup of the files (the log's
    compaction, the projections' purge) failed: what holds and what does not, and how to finish
    it -- a :class:`DiskFullError` when the log or the projections said the disk is full (each
    types its own errors), else a :class:`StorageError`. They were the driver's raw errors (a
    traceback from the CLI), saying nothing of the erase (outside audit, helper-52)."""
    text = e.message if isinstance(e, EventLogError) else f"{type(e).__name__}: {e}"
    full = isinstance(e, DiskFullError)
    if full and "disk is full" not in text:
        text = f"the disk is full: {text}"
    cls = DiskFullError if full else StorageError
    return cls(f"erase {seq} is recorded (the log holds none of the erased content), but cleaning the files after "
               f"it failed ({text}); until that is done, the log's free pages and the projections' files keep the "
               "erased bytes, and reads that cannot catch up may still show them",
               hint=("free disk space, then " if full else "") + "retry the erase (or run `eventlog compact`): it "
                    "finishes the cleanup; `eventlog doctor` reports it unfinished meanwhile")


_SESSION_FIELDS = ("source", "model", "model_config", "cwd", "git_repo_root", "git_branch", "parent_session_id",
                   "user_id", "chat_id", "chat_type", "thread_id", "title", "title_source", "started_at")
_FLAG_EVENTS = {
    "archive": "session.archived", "unarchive": "session.unarchived",
    "pin": "session.pinned", "unpin": "session.unpinned",
    "hide": "session.hidden", "unhide": "session.unhidden",
}
_LINEAGE_FLAG_TYPES = frozenset(_FLAG_EVENTS.values())


def registry_of(extensions: Any, registry: Registry | None = None) -> Registry:
    """``registry`` (a new one when None) with ``extensions`` (a list of :class:`Extension`)
    added; raises :class:`ValidationError` for anything else."""
    from eventlog.sessions.extensions import Extension, Registry

    if isinstance(extensions, Extension) or not isinstance(extensions, (list, tuple)):
        raise ValidationError("extensions", "must be a list of eventlog.sessions.extensions.Extension")
    out = Registry() if registry is None else registry
    if registry is not None:
        # All or nothing: tried on a copy first, so that an open refused for its third
        # extension leaves the first two unregistered (they were accepted by every other
        # handle of the profile after the open had failed).
        trial = Registry(registry.extensions.values())
        for ext in extensions:
            trial.add(ext)
    for ext in extensions:
        out.add(ext)
    return out


class _Shared:
    """What every :class:`SessionStore` handle of one profile opened in this process shares: the
    log, the read model (its projector, its follower). Reference-counted; the last handle to
    close it closes them."""

    def __init__(self, key: tuple[str, str, str], log: Log, owns_log: bool, reads: ReadModel,
                 projector: Projections | None, registry: Registry | None = None) -> None:
        self.key = key
        self.log = log
        self.owns_log = owns_log
        self.reads = reads
        self.projector = projector
        self.refs = 0
        self.followers = 0  # handles that asked for a follower: it runs while any is open
        self._follower_lock = threading.Lock()
        self.last_seq = 0  # the last append of any handle: reads see every handle's writes
        self._seq_lock = threading.Lock()
        self._registry: Registry | None = registry
        self._opened: set[str] = set()  # read models brought up to the log as a store opened

    @property
    def registry(self) -> Registry:
        """The event types and read models of this profile's stores (built on first use: the
        extension machinery is not loaded by stores that never use it)."""
        if self._registry is None:
            from eventlog.sessions.extensions import Registry

            self._registry = Registry()
        return self._registry

    def add_extensions(self, extensions: Any) -> None:
        """Register ``extensions`` (a list of :class:`Extension`) for every handle of this core."""
        if extensions is None:
            return
        with self._seq_lock:
            before = list(self.registry.extensions.values())
            registry = registry_of(extensions, self.registry)
            new = [name for name in registry.read_models if name not in self._opened]
            if self.projector is not None and registry.read_models:
                self.projector.register_read_models(dict(registry.read_models), registry.upcast)
        if self.projector is not None:
            head = self.log.head()[0]
            try:
                for name in new:  # built (or brought up to the log) now, as the store opens
                    try:
                        self.projector.advance_read_model(name, head, wait=OPEN_READ_MODEL_WAIT)
                    except ProjectionError:
                        if self.projector.read_model_broken(name) is not None:
                            raise
                        # another process holds the projector lease and does not catch up (stopped):
                        # the open does not wait for it; a read of the model waits as reads do
                        _log.warning("read model %r is behind the log: another process holds the projector lease",
                                     name)
            except BaseException:
                # The open is refused (a read model of it broken at once): its extensions go
                # again, all or none. They stayed registered: the other handles accepted their
                # events, and the fixed extension was refused as another one taking the namespace.
                self._unregister_all_but(before)
                raise
        self._opened.update(new)

    def _unregister_all_but(self, kept: list[Any]) -> None:
        from eventlog.sessions.extensions import Registry

        with self._seq_lock:
            registry, fresh = self.registry, Registry(kept)
            registry.types, registry.read_models, registry.extensions = fresh.types, fresh.read_models, fresh.extensions
            if self.projector is not None:
                self.projector.register_read_models(dict(registry.read_models), registry.upcast)

    def appended(self, seq: int) -> None:
        with self._seq_lock:
            if seq > self.last_seq:
                self.last_seq = seq

    # A handle's close drops its follower outside the open lock, while another thread may open
    # one: the count and the follower's start or stop change together, under _follower_lock.
    # Unlocked, a start that found the stopping thread still alive did nothing (a store left
    # without its follower), a close raised RuntimeError joining a thread not yet started, and
    # a thread started while a stop was joining the old one kept running after the last close.
    def want_follower(self) -> None:
        with self._follower_lock:
            self.followers += 1
            if self.followers == 1 and self.projector is not None:
                self.projector.start_follower()

    def drop_follower(self) -> None:
        with self._follower_lock:
            self.followers -= 1
            if self.followers == 0 and self.projector is not None:
                self.projector.stop_follower()

    def close(self) -> None:
        try:
            self.reads.close()
        finally:
            if self.owns_log:
                self.log.close()


_shared: dict[tuple[str, str, str], _Shared] = {}
_shared_lock = threading.Lock()
_opening: dict[tuple[str, str, str], threading.Lock] = {}


def _activity(env: dict[str, Any], newest: float = 0.0) -> float | None:
    """When an event of a session was activity, in seconds, for :meth:`SessionStore.retention`:
    the time its data gives for the events that carry their own (a session's start, a message's
    timestamp, an end: an import keeps the source's), else the event's own time (``ts``); None
    for what is no activity: a deletion, an erased event, an import's echo without a time.

    No later than the event's ``ts``: what the data says happened was appended by then (an
    import of times in 2099 ages from the import). A time the read models show as unknown (a
    string, out of range) counts as the ``ts``: its age is not known, and retention erases
    only what it knows to be old.

    ``newest``: the latest ``ts`` (seconds) of the events before it in the log. An event appended
    after them was not written before them: when its ``ts`` is earlier, its writer's clock was
    behind by at least that much (a host whose clock jumped back, a PostgreSQL host whose clock
    is late), and its times are moved forward by as much, so that retention does not take a
    session written a moment ago for one a year old. An import's times are the source's and
    stay as they are."""
    etype, data = env.get("type"), env.get("data")
    if etype == "session.deleted" or env.get("erased") is True or not isinstance(data, dict):
        return None
    field = ev.EVENT_TIME_FIELDS.get(etype) if isinstance(etype, str) else None
    given = data.get(field) if field is not None else None
    imported = data.get("imported") is True
    ts = rules.event_time(env.get("ts"))
    behind = 0.0 if imported or ts is None else max(0.0, newest - ts)
    at = rules.as_number(given, 0.0, rules.MAX_TIME)
    if at is not None:
        return (at if ts is None else min(at, ts)) + behind
    if imported and given is None:
        return None
    return None if ts is None else ts + behind


def _user() -> str:
    """Who erases, for the audit record: the OS user name (``unknown`` when it cannot be told)."""
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # no user database entry (a container): say so rather than fail the erase
        return "unknown"


def _close_all_at_exit() -> None:
    """At interpreter exit, stop every follower and close what is still open, so that no
    background thread meets a half torn-down interpreter (and prints a traceback)."""
    with _shared_lock:
        cores = list(_shared.values())
        _shared.clear()
    for core in cores:
        try:
            core.close()
        except Exception:  # exiting anyway: nothing is lost (the log is durable), say it once
            _log.warning("closing %s at exit failed", core.key[0], exc_info=False)


atexit.register(_close_all_at_exit)


def _forget_after_fork() -> None:
    """In a forked child the parent's shared stores are the parent's (their LMDB environment
    and SQLite connections must not be used, or closed, here): the next open in the child opens
    its own. The locks are new too — another thread of the parent may have held them."""
    global _shared_lock
    _shared_lock = threading.Lock()
    _shared.clear()
    _opening.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _titled(event: dict[str, Any]) -> bool:
    data = event.get("data")
    return (event.get("type") in ("session.created", "session.titled") and isinstance(data, dict)
            and data.get("title") is not None)


def _check_titles(reads: ReadModel, batch: list[dict[str, Any]]) -> None:
    """Refuse a batch that gives a session a title another live session holds, counting the
    batch's own earlier titles and deletions (:class:`TitleConflictError`)."""
    holders: dict[str, str | None] = {}  # title -> its holder as of the batch so far
    current: dict[str, str | None] = {}  # session -> its title as of the batch so far

    def title_of(sid: str) -> str | None:
        return current[sid] if sid in current else (reads.get_session(sid) or {}).get("title")

    for e in batch:
        sid = e["session"]
        if e["type"] == "session.deleted":
            gone = title_of(sid)
            if gone is not None:
                holders[gone] = None
            current[sid] = None
            continue
        if not _titled(e):
            continue
        title = e["data"]["title"]
        holder = holders[title] if title in holders else reads.title_holder(title)
        if holder is not None and holder != sid:
            raise TitleConflictError(title, holder)
        old = title_of(sid)
        if old is not None and old != title:
            holders[old] = None
        holders[title], current[sid] = sid, title


class SessionStore:
    """Sessions of one profile. Open with :meth:`open`; use as a context manager.

    Any number of stores may be open on one profile in one process (two libraries in one
    runtime, many threads): they share one log, one projector and one follower; each closes on
    its own, and a store used after its own ``close()`` raises :class:`ClosedError`.
    """

    def __init__(self, core: _Shared, *, home: Path | None, profile: str, follower: bool = False) -> None:
        self._core = core
        self.log = core.log
        self.home = home
        self.profile = profile
        self._reads = core.reads
        self._projector = core.projector
        self._follower = follower
        self._live: dict[str, int | None] = {}  # session -> its stream version when last known live
        self._deleted: set[str] = set()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, home: str | Path | None = None, profile: str = DEFAULT_PROFILE, *, log: Log | str | None = None,
             **options: Any) -> "SessionStore":
        """Open (creating if needed) ``profile`` under ``home`` (default ``$EVENTLOG_HOME`` or ~/.eventlog).

        ``log``: where the profile's events live. None (default): ``$EVENTLOG_LOG_URL`` if set,
        else the LMDB log under ``home``. A ``postgresql://`` URL (or a log directory): that log,
        opened and closed by the store (see :func:`eventlog.log.open_log`). A :class:`eventlog.log.Log`
        object: used as it is, and closing it is left to the caller. The projections live in the
        profile's directory under ``home`` whatever the log.
        Options: ``durability`` ("sync" | "nosync"), ``read_model`` ("projection" | "fold"),
        ``lock_timeout`` (seconds, default 10: how long an append waits for another process
        holding the LMDB log's writer lock before :class:`WriterBusyError` names it; reads never
        wait for it), ``follower`` (bool, default True: a background thread applies new log events — this
        process's and other processes' — within 20 ms whenever it can take the projector
        lease; with False, each read brings the projections up to the log first).
        Opening a profile already open in this process is cheap: the stores share one log and
        one projector (a stronger ``durability`` than the open one raises ValidationError).
        """
        h = resolve_home(home)
        if log is None:
            log = os.environ.get(LOG_URL_ENV) or None
        if log is None:  # the LMDB log in the profile's directory: never on NFS, SMB, sshfs, ... (created below)
            refuse_network(h / "profiles" / validate_profile(profile) / "log")
        d = profile_dir(h, profile)
        if log is not None and not isinstance(log, (Log, str, os.PathLike)):
            raise ValidationError("log", f"must implement eventlog.log.Log or be a URL, got {type(log).__name__}")
        extensions = options.pop("extensions", None)
        kind = options.get("read_model", "projection")
        if type(options.get("follower", True)) is not bool:
            raise ValidationError("follower", "must be True or False")
        follower = bool(options.get("follower", True)) if kind == "projection" else False
        key = (os.path.realpath(d), "lmdb" if log is None else (f"object:{id(log)}" if isinstance(log, Log)
                                                               else str(log)), str(kind))
        with _shared_lock:
            opening = _opening.setdefault(key, threading.Lock())
        with opening:  # one open per profile at a time; other profiles open in parallel
            with _shared_lock:
                core = _shared.get(key)
                if core is not None:
                    # Held from the lookup on: the last other handle's close() in another thread
                    # meanwhile leaves the core open for this one. The reference was taken after
                    # the extensions were added, and such a close had closed the log and the
                    # projector under it: a store fresh from open() raised ClosedError.
                    core.refs += 1
            shared = core is not None
            if core is None:
                # Extension read models are registered with the projector before it heals, so
                # that a state.db rebuilt at open (missing, damaged, of an older schema) is built
                # with their tables in its one pass, and the catch-up after takes them along (one
                # decode of each event for all).
                registry = registry_of(extensions) if extensions is not None else None
                try:
                    core = cls._open_core(key, d, profile, log, dict(options), catch_up=not extensions,
                                          registry=registry)
                except PermissionError as e:  # a file or folder of another user's (a run with sudo)
                    raise denied(e, f"cannot open profile {profile!r}") from e
                with _shared_lock:
                    _shared[key] = core
                    core.refs += 1
            try:
                if shared:
                    cls._check_options(core, options)
                core.add_extensions(extensions)
            except BaseException:
                # Refused (an option, an extension, a read model that failed to build): the
                # reference goes; a core no handle holds any more goes with it (a core this open
                # made stayed registered with its log open, and every later open of the profile
                # in the process was served by that orphan).
                with _shared_lock:
                    core.refs -= 1
                    last = core.refs == 0
                    if last and _shared.get(key) is core:
                        del _shared[key]
                if last:
                    core.close()
                raise
            if follower:
                core.want_follower()
        return cls(core, home=h, profile=profile, follower=follower)

    @staticmethod
    def _check_options(core: _Shared, options: dict[str, Any]) -> None:
        allowed = {"durability", "map_size", "lock_timeout", "read_model", "follower", "batch_size", "check",
                   "extensions"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValidationError(unknown[0], "unknown SessionStore.open option")
        # The same values are refused whether or not the profile is open already: a second open
        # took lock_timeout="x", batch_size="x", check=1 or durability="bogus" without a word.
        SessionStore._check_values(options)
        wanted = options.get("durability", "sync")
        if wanted not in ("sync", "nosync"):
            raise ValidationError("durability", "must be one of ('sync', 'nosync')")
        if wanted == "sync" and getattr(core.log, "durability", "sync") not in ("sync", "memory"):
            raise ValidationError("durability", "this profile is already open in this process with durability "
                                  f"{core.log.durability!r}; close those stores to open it with 'sync'")

    @staticmethod
    def _check_values(options: dict[str, Any]) -> None:
        """Refuse an open option's value of the wrong kind (ValidationError naming it)."""
        timeout = options.get("lock_timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < 1e9:
                raise ValidationError("lock_timeout", "must be a number of seconds, 0 or more")
        for name in ("map_size", "batch_size"):
            value = options.get(name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValidationError(name, "must be a positive integer")
        if "check" in options and type(options["check"]) is not bool:
            raise ValidationError("check", "must be True or False")

    @classmethod
    def _open_core(cls, key: tuple[str, str, str], d: Path, profile: str, log: Log | str | os.PathLike[str] | None,
                   options: dict[str, Any], catch_up: bool = True, registry: Registry | None = None) -> _Shared:
        owns_log = not isinstance(log, Log)
        cls._check_values(options)
        durability = options.pop("durability", "sync")
        map_size = {k: options.pop(k) for k in ("map_size",) if k in options}
        timeout = options.pop("lock_timeout", None)
        options.pop("follower", None)  # the core starts no follower: handles ask for one
        if log is None:
            from eventlog.log.lmdb import EventLog

            lmdb_options: dict[str, Any] = {**map_size, **({"lock_timeout": float(timeout)} if timeout is not None else {})}
            refuse_lost_log(d)
            log = EventLog.open(d / "log", durability=durability, profile=profile, **lmdb_options)
        elif not isinstance(log, Log):
            if timeout is not None:  # a PostgreSQL log: the bound on an append's wait for its append lock
                map_size["lock_timeout"] = float(timeout)
            log = open_log(log, profile=profile, durability=durability, **map_size)
        try:
            reads, projector = cls._open_reads(d, log, profile, options, catch_up, registry)
        except BaseException:
            if owns_log:
                log.close()
            raise
        return _Shared(key, log, owns_log, reads, projector, registry)

    @staticmethod
    def _open_reads(d: Path, log: Log, profile: str, options: dict[str, Any],
                    catch_up: bool = True, registry: Registry | None = None) -> tuple[ReadModel, Projections | None]:
        kind = options.pop("read_model", "projection")
        allowed = {"batch_size", "check"} if kind == "projection" else set()
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValidationError(unknown[0], "unknown SessionStore.open option")
        if kind == "fold":
            return FoldReadModel(log), None
        if kind != "projection":
            raise ValidationError("read_model", "must be 'projection' or 'fold'")
        from projections.store_reads import open_read_model  # the facade may import projections

        read_models = (dict(registry.read_models), registry.upcast) if registry is not None and registry.read_models else None
        return open_read_model(d, log, profile, catch_up=catch_up, read_models=read_models, **options)

    def close(self) -> None:
        """Close this store (idempotent). Its appends are durable in the log already; the next
        read, here or in any process, brings the projections up to them. The shared log and
        projector close with the last store of the profile in this process."""
        with _shared_lock:
            if self._closed:
                return
            self._closed = True
            core = self._core
            core.refs -= 1
            last = core.refs == 0
            if last and _shared.get(core.key) is core:
                del _shared[core.key]
        if self._follower:
            core.drop_follower()
        if last:
            core.close()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ClosedError("this SessionStore is closed", hint="open the profile again")

    def read_status(self) -> dict[str, Any]:
        """How fresh this thread's last read was: ``{"stale", "projected_seq", "log_seq",
        "lease_holder", "lease_holder_state"}``. ``stale`` is True when the projections did not
        reach the log head (as of that read) because another process held the projector lease
        past the read's wait — a stopped or hung process, named by its pid when known."""
        self._check()
        reach = getattr(self._reads, "last_reach", lambda: None)()
        stale = bool(reach is not None and reach.stale)
        holder = state = None
        if stale and self._projector is not None:
            holder = self._projector.lease_holder()
            state = process_state(holder)
        return {"stale": stale, "projected_seq": None if reach is None else reach.cursor,
                "log_seq": None if reach is None else reach.target, "lease_holder": holder,
                "lease_holder_state": state}

    # ------------------------------------------------------------------ plumbing

    def _append(self, events: list[dict[str, Any]], expected_version: int | None = None) -> list[int]:
        self._check()
        seqs = self.log.append(events, expected_version=expected_version)
        top = max(seqs)
        self._core.appended(top)
        return seqs

    def _fresh(self, seen: int = 0) -> ReadModel:
        """The read model, caught up at least to this store's own last append (and to ``seen``)."""
        self._check()
        self._reads.advance(max(self._core.last_seq, seen))
        return self._reads

    def _append_live(self, sid: str, batch: list[dict[str, Any]]) -> list[int]:
        """The append hot path: ``batch`` (all in stream ``sid``) appended to a live session.

        A session this store saw live is not looked up again: the append is made at the stream
        version it knew then, so anything another handle or process appended to the stream
        since — a deletion — or an erase of it makes the log refuse it (nothing written), and
        the session is then checked again on the read model caught up to the log head. An
        established session this store has not seen is checked on the read model as it stands
        (no catch-up wait) plus the stream's own events past what that model holds; only an
        unknown or deleted session pays for the catch-up.

        Refused three times in a row (other processes keep appending to the same stream, each
        winning the log's lock first), the append is made under the profile's rules lock
        (:meth:`_ruled`), which every deletion and erase of a session also takes: checked on the
        read model caught up to the log head inside it, it cannot land after a deletion.

        Before the stream of a session it has not seen live is read, a log with a recorded damage
        refuses the append (:func:`refuse_if_damaged`): that read would cross the damaged event,
        and a page of it that makes liblmdb abort would take the process down. An append at a
        version already known reads nothing: the log's own append refuses it."""
        recheck = False
        for _ in range(3):
            version = self._live.get(sid)
            if version is None:
                refuse_if_damaged(self.log, "append refused")
                if recheck or sid in self._deleted:
                    # Caught up before the version is read, so that the check after it — which
                    # must cover what that version counts, a deletion by another process — is
                    # short: other writers of the stream get little time to move it on meanwhile.
                    self._fresh(self.log.head()[0])
                version = self._version_if_live(sid)
            try:
                seqs = self._append(batch, expected_version=version)
            except ConcurrencyError:
                self._live.pop(sid, None)  # the stream changed since: look again, caught up
                recheck = True
                continue
            self._remember(sid, version + len(batch))
            return seqs
        with self._ruled():
            self._need_live(sid, seen=self.log.head()[0])
            return self._append(batch)

    def _version_if_live(self, sid: str) -> int:
        """The stream version of ``sid``, read before a check that covers every event it counts:
        the read model as it stands plus the stream's events past it (:meth:`_peek_live`), or,
        when that says no, the read model caught up to the log head. NotFoundError when the
        session is not live. Appending at the version then refuses any change made since."""
        version = self.log.stream_version(sid)
        peek = getattr(self._reads, "peek", None)
        if sid in self._deleted or peek is None or not self._peek_live(sid, peek):
            self._need_live(sid, seen=self.log.head()[0])
        return version

    def _append_ruled(self, sid: str, make: Callable[[ReadModel], dict[str, Any] | None]) -> int | None:
        """Append the event ``make(reads)`` returns (None: nothing to append) to live session
        ``sid`` under the rules lock (:meth:`_ruled`): the check sees every write before it, and
        no deletion or erase (they take the lock too) can come between the check and the append."""
        with self._ruled() as reads:  # the read model caught up to the log head
            self._need_live(sid, seen=self.log.head()[0])
            event = make(reads)
            if event is None:
                return None
            seq: int = self._append([event])[0]
        self._live.pop(sid, None)  # its stream grew: the fast path reads the version again
        return seq

    def _peek_live(self, sid: str, peek: Callable[[], Any]) -> bool:
        """Whether ``sid`` is live on the read model as it stands (no catch-up wait), with the
        stream's events the model may not hold yet read from the log: a deletion another process
        appended a moment ago counts. (An ancestor's deletion there, which names no event in this
        stream, counts once the read model holds it — as on the version-checked fast path.)"""
        seen = getattr(self._reads, "peek_seq", None)
        after = seen() if seen is not None else None  # before the read: it covers at least this much
        try:
            if not peek().is_live(sid):
                return False
        except Exception:  # noqa: BLE001 - a projection file going away under the bare reader (another
            # process rebuilding or deleting it) is not this write's error: the full check heals it
            return False
        return after is None or not any(env.get("type") == "session.deleted"
                                        for env in self.log.read_session(sid, after=after))

    def _remember(self, sid: str, version: int | None = None) -> None:
        """``sid`` is live, its stream at ``version`` events (None: not known)."""
        if len(self._live) >= 10_000:
            self._live.clear()
        self._live[sid] = version

    def _need_live(self, session_id: Any, seen: int = 0) -> str:
        """``session_id``, checked live on the read model caught up to this store's writes and to
        ``seen`` (a log seq the caller already counted); NotFoundError when it is not."""
        sid = ev.validate_session_id(session_id)
        if not self._fresh(seen).is_live(sid) and not (self._stale() and self._live_in_log(sid)):
            raise NotFoundError("session", sid)
        return sid

    def _stale(self) -> bool:
        reach = getattr(self._reads, "last_reach", lambda: None)()
        return bool(reach is not None and reach.stale)

    def _live_in_log(self, sid: str, depth: int = 0) -> bool:
        """Whether ``sid`` is live by the log itself (its stream, and its ancestors' for a
        deletion's cascade): the check a writer falls back to when the projections are stale."""
        alive, parent = stream_life(self.log, sid)
        return alive and (parent is None or depth > 64 or self._live_in_log(parent, depth + 1))

    def _event(self, etype: str, session: str, data: dict[str, Any]) -> dict[str, Any]:
        return ev.make_event(etype, session, data)

    @contextmanager
    def _ruled(self) -> Iterator[ReadModel]:
        """Check a domain rule and append as one step across the processes of this host: a title
        held by one live session, the first end reason, title provenance. A lock file of the
        profile (:data:`RULES_LOCK`) serializes the writers that check such a rule, and the read
        model is brought up to the log head inside it, so each check sees every write that came
        before it — the loser of a race is told (``TitleConflictError``, ``None``) instead of
        being acknowledged for a write the fold then ignores. Deletions and erases take it too,
        and so does an append that fell back from its version check (:meth:`_append_live`), so
        such an append cannot land after a deletion. Other writes never take it."""
        self._check()
        path = os.path.join(self._core.key[0], RULES_LOCK)
        try:
            fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as e:  # a read-only or full file system: nothing was written
            raise StorageError(f"cannot take the profile's rules lock {path}: {e.strerror or e}",
                               hint="check that the profile directory is writable and has room") from e
        try:
            # Never waits forever: a holder that is stopped (SIGSTOP) or stuck costs the others at
            # most the log's own lock timeout, then WriterBusyError names it (nothing written).
            timeout = float(getattr(self.log, "lock_timeout", RULES_LOCK_TIMEOUT))
            if not flock_until(fd, time.monotonic() + timeout):
                raise WriterBusyError(path, flock_holder(path), timeout, lock="the rules lock")
            # A log shared by hosts (PostgreSQL) serializes the hosts' rule checks too.
            shared = getattr(self.log, "rules_lock", None)
            with shared(timeout) if shared is not None else contextlib.nullcontext():
                began = time.monotonic()
                reach = self._reads.advance(self.log.head()[0], wait=timeout)
                if reach is not None and not getattr(reach, "done", True):
                    # The rule cannot be checked on projections short of the log (a stopped lease
                    # holder, a full disk): refused, nothing written, the holder named -- or the
                    # full disk (it read "being written by another process" with no other process
                    # about: outside audit, helper-52).
                    holder = getattr(self._projector, "lease_holder", lambda: None)()
                    halt = getattr(getattr(self._projector, "site", None), "halt", None)
                    if halt and holder is None:
                        raise (DiskFullError if "full" in halt else StorageError)(
                            f"the projections cannot be brought up to the log ({halt}), and this write must check "
                            "them: nothing was written", hint="free disk space (or make the profile writable), then retry")
                    raise WriterBusyError(os.path.join(self._core.key[0], "projector.lock"), holder,
                                          round(time.monotonic() - began, 1), lock="the projector lease")
                yield self._reads
        finally:
            os.close(fd)  # drops the lock

    # ------------------------------------------------------------------ writes

    def create_session(self, id: str | None = None, **fields: Any) -> str:
        """Create a session and return its id (a time-sortable one is generated if not given).

        Fields: source, model, model_config, cwd, git_repo_root, git_branch, parent_session_id,
        user_id, chat_id, chat_type, thread_id, title, title_source, started_at.
        Raises ConflictError if the id was ever used, NotFoundError for an unknown parent,
        TitleConflictError for a title another session holds, ValidationError for bad input.
        """
        unknown = sorted(set(fields) - set(_SESSION_FIELDS))
        if unknown:
            raise ValidationError(unknown[0], "unknown session field")
        sid = new_id() if id is None else ev.validate_session_id(id)
        data = {k: v for k, v in fields.items() if v is not None}
        event = self._event("session.created", sid, data)
        title, parent = event["data"].get("title"), event["data"].get("parent_session_id")
        # A title is a rule across sessions, and so is a parent's being live: checked on the read
        # model at the log head inside the rules lock, which deletions take too (a child created
        # after its parent's deletion would be an orphan no delete ever takes).
        ruled = title is not None or parent is not None
        with self._ruled() if ruled else contextlib.nullcontext(self._fresh()) as reads:
            if parent is not None and not reads.is_live(parent):
                raise NotFoundError("session", parent)
            if title is not None:
                holder = reads.title_holder(title)
                if holder is not None:
                    raise TitleConflictError(title, holder)
            try:
                self._append([event], expected_version=0)
            except ConcurrencyError:
                raise ConflictError("id", f"session id {sid!r} is already used",
                                    hint="omit id to get a fresh one") from None
        self._remember(sid, 1)  # its stream holds the creation alone
        return sid

    def append_message(self, session_id: str, role: str, content: Any = None, **fields: Any) -> int:
        """Append one message; returns its durable id (the seq of its event). A refused field is
        named as the caller passed it (``role``, not ``messages[0].role``)."""
        try:
            return self.append_messages(session_id, [dict(fields, role=role, content=content)])[0]
        except ValidationError as e:
            if not e.field.startswith("messages[0]."):
                raise
            named = type(e)(e.field[len("messages[0]."):], e.problem, hint=getattr(e, "hint", None))
            raise named from None

    def append_messages(self, session_id: str, messages: Iterable[dict[str, Any]]) -> list[int]:
        """Append several messages to one session in one atomic batch; returns their ids."""
        sid = ev.validate_session_id(session_id)
        if isinstance(messages, (str, bytes, bytearray, memoryview, dict)) or not hasattr(messages, "__iter__"):
            raise ValidationError("messages", f"must be a list of message dicts, got {type(messages).__name__}")
        batch = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise ValidationError(f"messages[{i}]", "must be a dict of message fields")
            data = {k: v for k, v in m.items() if v is not None}
            try:
                batch.append(self._event("message.appended", sid, data))
            except ValidationError as e:
                field = e.field[5:] if e.field.startswith("data.") else e.field
                raise ValidationError(f"messages[{i}].{field}", e.problem) from None
        if not batch:
            return []
        return self._append_live(sid, batch)

    def set_title(self, session_id: str, title: str, source: str = "user") -> int | None:
        """Set the title. Returns the seq, or None when a higher-provenance title is kept.

        Raises TitleConflictError if another live session holds the title.
        """
        sid = ev.validate_session_id(session_id)
        event = self._event("session.titled", sid, {"title": title, "source": source})

        def make(reads: ReadModel) -> dict[str, Any] | None:
            t = event["data"]["title"]
            holder = reads.title_holder(t)
            if holder is not None and holder != sid:
                raise TitleConflictError(t, holder)
            cur = reads.get_session(sid) or {}
            return None if rules.outranked(cur.get("title_source"), event["data"]["source"]) else event

        return self._append_ruled(sid, make)

    def next_title(self, base: str, *, also_taken: Iterable[str] = ()) -> str:
        """The next free title of a lineage: ``base``, else ``base #2``, ``base #3``, ...
        ``also_taken``: titles to count as held though the log does not hold them yet (those
        of earlier events in a batch being written); a lone string is one title, not its letters."""
        taken = {also_taken} if isinstance(also_taken, str) else set(also_taken)
        return ev.next_title(base, self._fresh().titles() | taken)

    def _flag(self, which: str, session_id: str) -> int:
        sid = ev.validate_session_id(session_id)
        return self._append_live(sid, [self._event(_FLAG_EVENTS[which], sid, {})])[0]

    def archive(self, session_id: str) -> int:
        """Archive the session's whole lineage."""
        return self._flag("archive", session_id)

    def unarchive(self, session_id: str) -> int:
        return self._flag("unarchive", session_id)

    def pin(self, session_id: str) -> int:
        """Pin the session's whole lineage (pinned sessions are always listed)."""
        return self._flag("pin", session_id)

    def unpin(self, session_id: str) -> int:
        return self._flag("unpin", session_id)

    def hide(self, session_id: str) -> int:
        """Hide the session's whole lineage from listings and search."""
        return self._flag("hide", session_id)

    def unhide(self, session_id: str) -> int:
        return self._flag("unhide", session_id)

    def _message_session(self, message_id: Any) -> str:
        if type(message_id) is not int or not 1 <= message_id <= rules.INT64_MAX:
            raise ValidationError("message_id", "must be a positive 64-bit integer (a message's seq)")
        sid = self._fresh().message_session(message_id)
        if sid is None or not self._reads.is_live(sid):
            raise NotFoundError("message", message_id)
        return sid

    def react(self, message_id: int, author: str, emoji: str) -> int:
        """Set ``author``'s reaction on a message (the same emoji again retracts it, another replaces it)."""
        sid = self._message_session(message_id)
        return self._append_live(sid, [self._event("message.reaction_set", sid,
                                                   {"message_id": message_id, "author": author, "emoji": emoji})])[0]

    def remove_reaction(self, message_id: int, author: str) -> int:
        sid = self._message_session(message_id)
        return self._append_live(sid, [self._event("message.reaction_removed", sid,
                                                   {"message_id": message_id, "author": author})])[0]

    def take_unseen_reactions(self, session_id: str) -> list[dict[str, Any]]:
        """Return the session's unseen reactions and mark them seen: each is taken exactly once,
        even with several processes taking at the same time."""
        sid = self._need_live(session_id)
        while True:
            version = self.log.stream_version(sid)
            self._reads.advance()
            unseen = self._reads.unseen_reactions(sid)
            if not unseen:
                return []
            up_to = max(r["set_seq"] for r in unseen)
            try:
                self._append([self._event("reactions.seen", sid, {"up_to": up_to})], expected_version=version)
            except ConcurrencyError:
                continue  # someone else appended to the stream: look again
            return unseen

    def record_usage(self, session_id: str, **fields: Any) -> int:
        """Record token usage and cost (model, provider, task, *_tokens, estimated/actual_cost_usd, message_id)."""
        sid = ev.validate_session_id(session_id)
        event = self._event("usage.recorded", sid, {k: v for k, v in fields.items() if v is not None or k.endswith("cost_usd")})
        return self._append_live(sid, [event])[0]

    def update_meta(self, session_id: str, **fields: Any) -> int:
        """Update model, model_config, cwd, git_repo_root, git_branch, tool_names or source."""
        sid = ev.validate_session_id(session_id)
        event = self._event("session.meta_updated", sid, fields)
        return self._append_live(sid, [event])[0]

    def end_session(self, session_id: str, reason: str) -> int | None:
        """End the session; the first reason wins (returns None if it was already ended)."""
        sid = ev.validate_session_id(session_id)
        event = self._event("session.ended", sid, {"reason": reason})
        return self._append_ruled(sid, lambda reads: None if (reads.get_session(sid) or {}).get("end_reason")
                                  is not None else event)

    def reopen(self, session_id: str) -> int:
        sid = ev.validate_session_id(session_id)
        return self._append_live(sid, [self._event("session.reopened", sid, {})])[0]

    def rewind(self, session_id: str, message_id: int, expected_version: int | None = None) -> int:
        """Hide ``message_id`` and every later message of the session (the log keeps them)."""
        sid = self._need_live(session_id)
        if self._message_session(message_id) != sid:
            raise NotFoundError("message", message_id)
        event = self._event("messages.rewound", sid, {"message_id": message_id})
        if expected_version is None:
            return self._append_live(sid, [event])[0]
        return self._append([event], expected_version=expected_version)[0]

    def delete_session(self, session_id: str, expected_version: int | None = None) -> int:
        """Tombstone the session and its descendants; they vanish from every read model.

        The session's ``session.deleted`` deletes its descendants too (the cascade of every read
        model); each live descendant also gets a ``session.deleted`` of its own, appended right
        after the session's, so that a writer in another process that counted a descendant's
        stream is refused instead of appending to a session that is gone. The descendants are
        read with the read model caught up to the log head, under the rules lock
        (:meth:`_ruled`), which a writer that fell back from the version-checked append takes
        too."""
        sid = ev.validate_session_id(session_id)
        with self._ruled() as reads:
            self._need_live(sid, seen=self.log.head()[0])
            # The whole lineage (a superset of what the cascade deletes): members only lose the
            # append fast path and are checked against the caught-up read model again.
            doomed = [sid, *reads.lineage(sid)]
            children: dict[str | None, list[str]] = {}
            for m in doomed[1:]:
                children.setdefault((reads.get_session(m) or {}).get("parent_session_id"), []).append(m)
            below = rules.descendants(sid, lambda s: children.get(s, ()))
            seq: int = self._append([self._event("session.deleted", sid, {})], expected_version=expected_version)[0]
            if below:
                self._append([self._event("session.deleted", m, {}) for m in below])
        self._deleted.update(doomed)
        for gone in doomed:
            self._live.pop(gone, None)
        return seq

    def check_events(self, events: Iterable[dict[str, Any]]) -> None:
        """Check ``events`` exactly as :meth:`append_events` checks its input — each against its
        type's validator, and against the log's own rules (plain JSON, 16 MiB an event) — and
        append nothing. For a caller that must do something else first (create the session
        the events go to) and may not leave that behind when the events are refused."""
        self._check()
        if isinstance(events, (str, bytes, dict)) or not hasattr(events, "__iter__"):
            raise ValidationError("events", f"must be a list of event objects, got {type(events).__name__}")
        registry = self._core.registry
        prepare_batch([registry.event(e, i) for i, e in enumerate(events)], None)

    def _check_references(self, batch: list[dict[str, Any]], created: set[str]) -> None:
        """What the store's own methods require of the catalogue events of a batch, in batch
        order: the message a reaction or a rewind names is a message of the event's session (by
        seq, so not one of this batch's); a ``session.created`` uses an id never used (in the log
        or earlier in the batch) under a live parent; and nothing follows, in the batch, the
        deletion of its session or of an ancestor of it. NotFoundError or ConflictError, nothing
        appended. (Whether the sessions named are live in the log is checked at the append.)"""
        made: dict[str, str | None] = {}  # created in the batch: its parent
        deleted: set[str] = set()

        def parent_of(sid: str) -> str | None:
            if sid in made:
                return made[sid]
            row = self._fresh().get_session(sid)
            parent = row.get("parent_session_id") if row else None
            return parent if isinstance(parent, str) else None

        def gone_in_batch(sid: str | None) -> bool:
            for _ in range(65):  # a lineage is at most 64 deep (rules.lineage)
                if sid is None:
                    return False
                if sid in deleted:
                    return True
                sid = parent_of(sid)
            return False

        for e in batch:
            data, sid = e["data"], e["session"]
            if not self._core.registry.is_catalogue(e["type"]):
                continue
            if e.get("id") is not None and self.log.event_seq(e["id"]) is not None:
                # a retried batch: the log answers for an id it holds (the same event, or refused)
                if e["type"] == "session.created":
                    made[sid] = data.get("parent_session_id")
                continue
            if e["type"] == "session.created":
                if sid in made or self.log.stream_version(sid) > 0:
                    raise ConflictError("id", f"session id {sid!r} is already used",
                                        hint="omit the session.created event, or use a new session id")
                parent = data.get("parent_session_id")
                if parent is not None and (gone_in_batch(parent) or (
                        parent not in made and not self._fresh(self.log.head()[0]).is_live(parent))):
                    raise NotFoundError("session", parent)
                made[sid] = parent
                continue
            if deleted and gone_in_batch(sid):
                raise NotFoundError("session", sid)
            if e["type"] in ev.MESSAGE_REFERENCES:
                mid = data["message_id"]
                if (self._fresh().message_session(mid) != sid
                        and self._fresh(self.log.head()[0]).message_session(mid) != sid):
                    raise NotFoundError("message", mid)
            elif e["type"] == "session.deleted":
                deleted.add(sid)

    def append_events(self, events: Iterable[dict[str, Any]], expected_version: int | None = None) -> list[int]:
        """Append events of registered types (the session catalogue's or an extension's,
        ``SessionStore.open(extensions=[...])``) in one atomic batch; returns their seqs.

        Each is ``{"type", "session"?, "data", "id"?}``, checked by its type's validator
        (:class:`ValidationError` naming ``events[i].<field>``; nothing is appended). An event of
        the session catalogue must name a live session (or one the batch creates), and a title
        it sets must be free (:class:`TitleConflictError`); the other domain rules of the store's
        own methods (title provenance, the first end reason, ...) are theirs: an event that
        loses to one is stored and the fold passes over it. ``expected_version``: as for :meth:`eventlog.log.Log.append`.
        """
        self._check()
        if isinstance(events, (str, bytes, dict)) or not hasattr(events, "__iter__"):
            raise ValidationError("events", f"must be a list of event objects, got {type(events).__name__}")
        registry = self._core.registry
        batch = [registry.event(e, i) for i, e in enumerate(events)]
        if not batch:
            return []
        created = {e["session"] for e in batch if e["type"] == "session.created"}
        self._check_references(batch, created)
        if any(_titled(e) for e in batch):
            # Titles are unique in a profile: checked, with the sessions the batch names, on the
            # read model at the log head inside the rules lock, as set_title checks them.
            with self._ruled() as reads:
                _check_titles(reads, batch)
                for sid in dict.fromkeys(e["session"] for e in batch if registry.is_catalogue(e["type"])
                                         and e["session"] not in created):
                    if not reads.is_live(sid):
                        raise NotFoundError("session", sid)
                seqs = self._append(batch, expected_version=expected_version)
            for sid in {e["session"] for e in batch}:
                self._live.pop(sid, None)
            return seqs
        streams = {e["session"] for e in batch}
        if (expected_version is None and len(streams) == 1 and not created
                and all(registry.is_catalogue(e["type"]) for e in batch)):
            # Events of one live session: appended as its own methods do, at the version checked
            # (a deletion or erase by another process refuses it), so never into a session gone.
            sid = batch[0]["session"]
            try:
                return self._append_live(sid, batch)
            except NotFoundError:
                raise NotFoundError("session", sid) from None
        head = self.log.head()[0] if expected_version is None else 0
        for sid in dict.fromkeys(e["session"] for e in batch if registry.is_catalogue(e["type"])
                                 and e["type"] != "session.created" and e["session"] not in created):
            # Several sessions in one batch cannot be appended at versions: each is checked on
            # the read model caught up to the log head (the version guards the single-stream case).
            # At a version the caller guards its stream: the read model as it stands, with the
            # stream's events past it (no wait behind a stopped catch-up), is the check its own
            # methods make on their version-checked path.
            peek = getattr(self._reads, "peek", None) if expected_version is not None else None
            if peek is not None and sid not in self._deleted and self._peek_live(sid, peek):
                continue
            try:
                self._need_live(sid, seen=head)
            except NotFoundError:
                raise NotFoundError("session", sid) from None
        seqs = self._append(batch, expected_version=expected_version)
        for sid in {e["session"] for e in batch}:
            if self._live.get(sid) is not None:
                self._live[sid] = None  # its stream grew here: the fast path reads the version again
        return seqs

    @contextmanager
    def read_model(self, name: str, *, wait: float = 30.0) -> Iterator[sqlite3.Connection]:
        """A read-only SQLite connection on state.db where extension read model ``name`` holds
        every event this process appended — and, in a process without a follower of its own,
        every event in the log as of the call — waiting at most ``wait`` seconds for another
        process's catch-up. The whole block reads one snapshot, of this store's version of the
        read model (a process running another version rebuilds its tables; see
        docs/ARCHITECTURE.md); the caller may still BEGIN and COMMIT on the connection. Close
        it (``with``) before the next write."""
        self._check()
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < 1e9:
            raise ValidationError("wait", "must be a number of seconds, 0 or more")
        if name not in self._core.registry.read_models:
            raise ValidationError("name", f"no read model {name!r} is registered on this store",
                                  hint="pass its extension to SessionStore.open(extensions=[...])")
        projector = self._need_projector()
        # As every read: with a follower of its own the process sees its own writes at once and
        # others' within the follower's poll; without one, everything in the log as of now.
        target = self._core.last_seq if projector.following else max(self._core.last_seq, self.log.head()[0])
        version = self._core.registry.read_models[name].version
        deadline = time.monotonic() + wait
        healed = False
        while True:
            damaged = False
            with contextlib.ExitStack() as stack:
                try:
                    conn = stack.enter_context(projector.read_model(name, target, max(0.0, deadline - time.monotonic())))
                    # How far the log verifies (projections.site.Site): never past a damaged event.
                    site = getattr(projector, "site", None)
                    pin = _pin_read_model(conn, name, version, target if site is None else site.reachable(target))
                except sqlite3.Error as e:
                    # A damaged state.db met here (by the read model's catch-up or this
                    # connection) is repaired once and read again, as the core reads do: it was a
                    # raw sqlite3 error on every read until another process or `doctor --fix`
                    # rebuilt the file (outside audit, helper-67).
                    mendable, typed = projector.fault(e, f"reading the read model {name!r}")
                    if healed or not mendable:
                        raise typed from e
                    damaged = healed = True
                    pin = None
                if pin is not None:
                    try:
                        yield conn
                    finally:
                        with contextlib.suppress(sqlite3.ProgrammingError):  # the caller closed it
                            pin.close()
                    return
            if damaged:
                projector.heal(full=True)
                continue
            # Between the catch-up and this connection's first read, a process that registers
            # another version of this read model (an old gateway beside a new CLI) rebuilt its
            # tables as that version: catch them up again for this one.
            if time.monotonic() >= deadline:
                raise ProjectionError(f"read model {name!r} (version {version}) did not hold seq {target} in time: "
                                      "another process keeps rebuilding it as another version",
                                      hint="stop the process that runs the other version of its extension")

    def erase_session(self, session_id: str, reason: str, *, by: str | None = None) -> dict[str, Any]:
        """Make the content of a session — and of its descendants (the lineage rule of
        :meth:`delete_session`) — unrecoverable: every event of their streams is replaced by its
        erased form (type, time and hash kept; data gone) and one ``log.erased`` record says who
        (``by``, default the OS user), when, why (``reason``) and which events; the log is then
        compacted and the projections rebuilt so that no file under the profile keeps the words.
        The chain still verifies. Works on deleted sessions too (a tombstone keeps the words;
        this does not). Returns ``{"seq", "sessions", "events"}``; erasing again finds nothing
        left (``seq`` 0, ``events`` 0). NotFoundError for a session the log never had."""
        self._check()
        sid = ev.validate_session_id(session_id)
        reason = _check_reason(reason)
        by = _check_by(by)

        def pick() -> list[str]:
            members = self._lineage_in_log(sid)
            if not members:
                raise NotFoundError("session", sid)
            return members

        members, seq, erased = self._erase_streams(pick, {"reason": reason, "by": by})
        return {"seq": seq, "sessions": members, "events": erased}

    def _erase_streams(self, pick: Callable[[], list[str]], record: dict[str, Any]) -> tuple[list[str], int, int]:
        """Erase every event of the sessions ``pick()`` names (``record``: the erase record's
        reason and by), then compact and purge; returns ``(sessions, seq of the erase, events
        erased)``. Shared by :meth:`erase_session` and :meth:`retention`."""
        erase = getattr(self.log, "erase")
        compact = getattr(self.log, "compact", None)
        # The streams are read outside the log's write lock: another process may append to them
        # until the erase lands (its append was acknowledged before the erase, so it goes with
        # the session). Erased again until nothing of them is left; once a stream ends in an
        # erased event, the log refuses every append counted before (ConcurrencyError) and the
        # writer finds the session gone.
        seq = erased = 0
        with self._ruled():  # a writer that fell back from the version-checked append waits
            # The sessions are chosen inside the rules lock: a creation with a parent takes it and
            # checks the parent live, so no child of theirs appears between the choice and the
            # erase (outside audit, helper-42: children created meanwhile stayed, readable).
            members = pick()
            if not members:
                return [], 0, 0
            events = [_erase_view(env) for member in members for env in self.log.read_session(member)]
            if any(env.get("type") in _LINEAGE_FLAG_TYPES for env in events):
                # each erased lineage's top: its parent (as its creation, read above, names it) stays
                inside = set(members)
                for env in events:
                    parent = env["data"].get("parent_session_id") if env.get("type") == "session.created" \
                        and isinstance(env.get("data"), dict) else None
                    if isinstance(parent, str) and parent not in inside:
                        self._keep_lineage_flags(parent, inside)
            data = {**record, "sessions": members}
            for gone in members:
                self._live.pop(gone, None)
            self._deleted.update(members)
            seen = {m: 0 for m in members}  # per stream, the last seq read (each round reads what is new)
            for _ in range(ERASE_ROUNDS):
                for env in events:
                    seen[env["session"]] = max(seen[env["session"]], env["seq"])
                seqs = sorted(env["seq"] for env in events if not env.get("erased"))
                if not seqs:
                    break
                # More events than one record can name (its [seq, hash] list is bound by the event
                # size limit): the oldest are erased first, in records that fit, each its own commit
                # (outside audit, helper-87: a session of 250,000 events, or a retention over
                # 100,000 small sessions, could never be erased: the record was refused as too large).
                per_record = erase_record_room(data)
                while len(seqs) > per_record:
                    part, seqs = seqs[:per_record], seqs[per_record:]
                    got = int(erase(part, data, compact=False) if compact is not None else erase(part, data))
                    seq, erased = max(seq, got), erased + (self._erased_by(got, len(part)) if got else 0)
                # The streams too, read inside the erase: one round leaves nothing of them, and a
                # process killed after it leaves no event of theirs live (outside audit, PostgreSQL:
                # killed between rounds, the writes of another host stayed live and acknowledged).
                got = int(erase(seqs, data, compact=False, streams=members) if compact is not None
                          else erase(seqs, data, streams=members))
                seq, erased = max(seq, got), erased + (self._erased_by(got, len(seqs)) if got else 0)
                events = [_erase_view(env) for member in members
                          for env in self.log.read_session(member, after=seen[member])]
            else:
                raise ConcurrencyError(members[0], 0, len(events))
        if not seq:
            self.finish_erase()  # an earlier erase of it killed before its files were clean
            return members, seq, erased
        try:
            with self._erase_cleanup():  # (not held after its wait: cleaned anyway, safe twice)
                self._clean_after_erase(seq, compact)
        except Exception as e:
            raise _cleanup_failed(seq, e) from e
        return members, seq, erased

    def _erased_by(self, seq: int, asked: int) -> int:
        """How many events the erase record at ``seq`` names: the seqs asked for and every event
        of the streams appended since they were read (the erase takes those too, inside its
        transaction; counting only the seqs asked for fell short of the record: outside audit,
        helper-74). The erase is done: a log that cannot be read back now (a PostgreSQL server
        gone away right after the commit) gives ``asked``, the count known before, rather than
        turning a finished erase into an error that skips its cleanup (helper-77)."""
        try:
            record = self.log.get(seq)
        except StorageError as e:
            _log.warning("erase %d is done; reading its record back to count what it erased failed (%s): counting "
                         "the %d events asked for", seq, e, asked)
            return asked
        data = record.get("data") if record is not None else None
        return len(data.get("erased") or ()) if isinstance(data, dict) else 0

    @contextmanager
    def _erase_cleanup(self) -> Iterator[bool]:
        """Hold the profile's :data:`ERASE_LOCK` while cleaning the files after an erase; yields
        whether it is held. False: another process or thread held it for the log's lock timeout
        (a stopped holder), or the lock file cannot be made -- a cleanup is safe without it, only
        done twice."""
        path = os.path.join(self._core.key[0], ERASE_LOCK)
        try:
            fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError:
            yield False
            return
        try:
            timeout = float(getattr(self.log, "lock_timeout", RULES_LOCK_TIMEOUT))
            yield flock_until(fd, time.monotonic() + timeout)
        finally:
            os.close(fd)  # drops the lock

    def _clean_after_erase(self, seq: int, compact: Callable[[], Any] | None) -> None:
        """Compact the log after erase ``seq`` and purge the projections (a log that defers the
        compaction leaves the erase pending for its next one)."""
        compacted = True
        if compact is not None:
            after_erase = getattr(self.log, "compact_after_erase", None)
            if after_erase is not None:
                compacted = after_erase()
            else:
                compact()
        self._core.appended(seq)
        if self._projector is not None and compacted:
            self._purge_after_erase(seq)
        elif self._projector is not None:  # the erase stays pending: the next compaction finishes it
            self._projector.purge(after=seq)
        else:
            self._reads.advance(seq)

    def finish_erase(self) -> int:
        """Finish an erase whose process was killed after the erase was committed but before
        the log was compacted and the projections purged (the log records it until then):
        compact, purge, and record it done. Returns its seq, 0 when none was pending. A retried
        :meth:`erase_session` or :meth:`retention` calls it; :meth:`compact` does its part."""
        self._check()
        if not self._erase_pending():
            return 0
        # An erase whose cleanup is still running (another thread or process, which holds the
        # lock) is not a killed one: wait for it, then look again (outside audit, helper-56: two
        # concurrent erases of one session warned of a stopped process and compacted twice).
        with self._erase_cleanup() as held:
            seq = self._erase_pending()
            if not seq or not held:
                return 0  # finished meanwhile, or still being finished by its holder
            _log.warning("finishing the cleanup of erase %d (its process stopped before the files were clean)", seq)
            try:
                getattr(self.log, "compact")()
                self._purge_after_erase(seq)
            except EarlierProcessError:
                raise  # nothing changed: compact once those processes have stopped (its hint)
            except Exception as e:
                raise _cleanup_failed(seq, e) from e
        return seq

    def _erase_pending(self) -> int:
        pending = getattr(self.log, "erase_pending", None)
        return int(pending()) if pending is not None else 0

    def _purge_after_erase(self, seq: int) -> None:
        """The log is compacted after erase ``seq``: purge the projections and record the erase
        clean. Without a projector here the record stays for the next process that has one."""
        if self._projector is None:
            return
        self._projector.purge(after=seq)
        done = getattr(self.log, "erase_finished", None)
        if done is not None:
            done(seq)

    def _keep_lineage_flags(self, parent: str | None, erased: set[str]) -> None:
        """Before an erase whose streams set lineage flags (archived, pinned, hidden): those
        flags also hold for the sessions above the erased ones (from ``parent``, the parent of an
        erased lineage's top) that stay, and replayed without the erased events they would fall
        back. So the surviving lineage root's current flags are appended to its own stream first
        (an erase never changes a session it leaves). The parent comes from the log: a deleted
        child has no row to read it from (outside audit, helper-42: its flags were lost)."""
        reads = self._fresh()
        root, row, seen = None, None, set()
        while parent is not None and parent not in seen and parent not in erased and reads.is_live(parent):
            seen.add(parent)
            root, row = parent, reads.get_session(parent)
            parent = row.get("parent_session_id") if row is not None else None
        if root is None or row is None:
            return
        self._append([self._event(_FLAG_EVENTS[on if row.get(flag) else off], root, {})
                      for flag, on, off in (("archived", "archive", "unarchive"), ("pinned", "pin", "unpin"),
                                            ("hidden", "hide", "unhide"))])

    def _lineage_in_log(self, sid: str, children: dict[str, list[str]] | None = None) -> list[str]:
        """``sid`` and its descendants, live or deleted, read from the log (erased ones count
        too: the stubs keep their session). Empty when the log never had ``sid``. ``children``:
        :meth:`_scan_lineages`, when the caller already read it (one scan for many sessions)."""
        if not any(env.get("type") == "session.created" for env in self.log.read_session(sid)):
            return []
        members, frontier = {sid: None}, {sid}  # in order, each once (a list's `in` was quadratic in them)
        if children is None:
            children = self._scan_lineages()[0]
        while frontier:
            nxt = {c for p in frontier for c in children.get(p, ()) if c not in members}
            members.update(dict.fromkeys(sorted(nxt)))
            frontier = nxt
        return list(members)

    def _scan_lineages(self, cutoff: float | None = None
                       ) -> tuple[dict[str, list[str]], list[str], dict[str, float], float]:
        """One scan of the log: every session's children as the log names them, and (with
        ``cutoff``, seconds) the deleted sessions whose last activity is older than it and whose
        words the log still holds — a tombstone hides a session from every read model, so
        retention finds them here: a delete must not outlive a retention policy; so are the
        sessions of an erase stopped part-way, whatever their age — and every
        session's last activity (:func:`_activity`, seconds; with ``cutoff`` only), and the latest
        ``ts`` in the log (seconds; 0.0 for none)."""
        children: dict[str, list[str]] = {}
        last: dict[str, float] = {}
        words: set[str] = set()
        deleted: dict[str, None] = {}  # in log order
        erasing: dict[str, None] = {}  # named by an erase record, in log order
        newest = 0.0  # the latest ts so far, in log order (_activity)
        for env in self.log.read():
            sid = env.get("session")
            if cutoff is not None and isinstance(sid, str):
                at = _activity(env, newest)
                if at is not None and at > last.get(sid, 0.0):
                    last[sid] = at
                if env.get("erased") is not True:
                    words.add(sid)
                if env.get("type") == "session.deleted":
                    deleted.setdefault(sid)
            if env.get("type") == "session.created" and isinstance(env.get("data"), dict):
                parent = env["data"].get("parent_session_id")
                if isinstance(parent, str) and isinstance(sid, str):
                    children.setdefault(parent, []).append(sid)
            elif env.get("type") == "log.erased" and isinstance(env.get("data"), dict):
                # An erased session.created no longer names its parent; the erase record does.
                named = env["data"].get("sessions")
                if isinstance(named, list) and named and all(isinstance(n, str) for n in named):
                    children.setdefault(named[0], []).extend(n for n in named[1:])
                    # one of its sessions with an event before the record still live: that erase
                    # stopped part-way (events after it are the id used anew, as Hermes may)
                    erasing.update(dict.fromkeys(n for n in named if n in words))
            newest = max(newest, rules.event_time(env.get("ts")) or 0.0)
        limit = cutoff or 0.0
        old = [sid for sid in deleted if sid in words and last.get(sid, 0.0) < limit]
        # A session an erase record names whose words from before that record the log still
        # holds: that erase stopped part-way (one of more events than a record names, killed
        # between its records) and the read models hide the session already; retention
        # finishes it whatever its age.
        picked = set(old)
        unfinished = [sid for sid in erasing if sid not in picked] if cutoff is not None else []
        return children, old + unfinished, last, newest

    def retention(self, older_than_s: float, *, dry_run: bool = False, reason: str = "retention",
                  by: str | None = None) -> dict[str, Any]:
        """Erase every lineage (a session and its descendants) whose last activity — of any of its
        sessions — is older than ``older_than_s`` seconds, and every deleted session as old whose
        words the log still holds, in one erase (several when one record cannot name them all)
        and one compaction, as :meth:`erase_session`
        erases (a write that lands meanwhile goes with its session, or is refused). ``dry_run``:
        only say which. Returns ``{"sessions", "erased_events", "seq", "dry_run", "cutoff",
        "newest"}``: ``cutoff`` is this host's clock less ``older_than_s`` (epoch seconds), the
        one clock retention trusts, and ``newest`` the latest ``ts`` in the log (None for an empty
        log), to hold it against: a clock far ahead makes every session old (``newest`` older
        than ``cutoff``), so run with ``dry_run`` first."""
        self._check()
        if isinstance(older_than_s, bool) or not isinstance(older_than_s, (int, float)) or not older_than_s >= 0:
            raise ValidationError("older_than", "must be a duration of 0 seconds or more")
        reason = _check_reason(reason)  # checked whether or not anything is old enough: the same input, the same answer
        by = _check_by(by)
        cutoff = time.time() - older_than_s
        seen = {"newest": 0.0}

        def pick() -> list[str]:
            live = self._fresh().list_sessions(archived=None, hidden=None, limit=None)
            children, deleted, last, seen["newest"] = self._scan_lineages(cutoff)
            # A session's last activity is its newest event's, not only its newest message's: a
            # LangGraph thread whose checkpoints are written now (no messages mirrored), a session
            # pinned, titled or used through an extension's events now is in use (outside audit,
            # helper-52: retention erased threads written a moment before).
            # The log's account when it has one: the read model's times are the data's as given.
            active = {s["id"]: last.get(s["id"], s.get("last_activity_at") or s.get("started_at") or 0)
                      for s in live}
            members: dict[str, None] = {}  # in order, each once (a list's `in` was quadratic in the sessions)
            # A session whose parent is gone (deleted or erased) is the root of what is left.
            roots = [s["id"] for s in live if s.get("parent_session_id") not in active and active[s["id"]] < cutoff]
            for sid in roots + deleted:
                lineage = self._lineage_in_log(sid, children)
                if any(active.get(m, 0) >= cutoff for m in lineage):
                    continue  # a descendant is still in use: the lineage is not old
                members.update(dict.fromkeys(lineage))
            return list(members)

        if dry_run:
            members, seq, erased = pick(), 0, 0
        else:
            members, seq, erased = self._erase_streams(pick, {"reason": reason, "by": by})
            if not members:
                self.finish_erase()  # an earlier erase killed before its files were clean
        return {"sessions": members, "erased_events": erased, "seq": seq, "dry_run": dry_run, "cutoff": cutoff,
                "newest": seen["newest"] or None}

    def compact(self) -> dict[str, Any]:
        """Rewrite the log file so freed space returns to the filesystem (LMDB log only); see
        :meth:`eventlog.log.lmdb.EventLog.compact`. ``{"bytes_before", "bytes_after", "generation"}``."""
        self._check()
        compact = getattr(self.log, "compact", None)
        if compact is None:
            raise ConflictError("log", "this log backend does not compact (only the LMDB log does)",
                                  hint="on PostgreSQL the server reclaims space (VACUUM, by its administrator): "
                                       "docs/POSTGRES.md")
        result: dict[str, Any] = compact()
        seq = self._erase_pending()
        if seq:  # an interrupted erase: its log part is done now
            self._purge_after_erase(seq)
        return result

    def erase_mark(self) -> int | None:
        """The log's erase mark (:meth:`eventlog.log.lmdb.EventLog.erase_mark`), or None when the
        log's backend does not keep one. It changes with every erase, which changes no stream
        version: a cache keyed on :meth:`version` compares it too."""
        self._check()
        mark = getattr(self.log, "erase_mark", None)
        return None if mark is None else int(mark())

    def gone(self, session_id: str) -> bool:
        """Whether the session existed and was deleted or erased (or lost an ancestor to a
        deletion), judged from the log itself whatever the read model's lag. False for an id never
        used. For a caller that maps its own ids onto sessions and must move on from one that is
        gone (the OpenAI Agents adapter after an erase)."""
        sid = ev.validate_session_id(session_id)
        self._check()
        return self.log.stream_version(sid) > 0 and not self._live_in_log(sid)

    def version(self, session_id: str) -> int:
        """The number of events in the session's stream (for ``expected_version``)."""
        self._check()
        return self.log.stream_version(ev.validate_session_id(session_id))

    def version_and_erase_mark(self, session_id: str) -> tuple[int, int | None]:
        """``(version(session_id), erase_mark())`` read together from one snapshot of the log (one
        round trip on PostgreSQL, where each alone is one): what a cache keyed on a stream version
        checks before it answers."""
        sid = ev.validate_session_id(session_id)
        self._check()
        both = getattr(self.log, "stream_state", None)
        if both is not None:
            version, mark = both(sid)
            return int(version), int(mark)
        return self.log.stream_version(sid), self.erase_mark()

    # ------------------------------------------------------------------ projections

    def _need_projector(self) -> Projections:
        self._check()
        if self._projector is None:
            raise ValidationError("read_model", "this operation needs the projection read model")
        return self._projector

    def rebuild(self, which: str = "all", progress: Any = None) -> dict[str, Any]:
        """Rebuild state.db and/or the FTS index (``which``: all|state|fts) from the log into new
        files and swap them in. Returns ``{"events", "seconds", "events_per_s", ...}``."""
        if which not in ("all", "state", "fts"):
            raise ValidationError("which", f"must be 'all', 'state' or 'fts', got {str(which)[:40]!r}")
        return self._need_projector().rebuild(which, progress=progress)

    def snapshot(self, out: str | Path, *, until_seq: int | None = None, as_of_ns: int | None = None,
                 progress: Any = None) -> dict[str, Any]:
        """Write a standalone state.db (FTS tables inside) of the profile as of a log prefix:
        the whole log, up to ``until_seq``, or up to the last event appended at ``as_of_ns``."""
        if not isinstance(out, (str, os.PathLike)):
            raise ValidationError("out", "must be the path of a file to write (not a directory)")
        path_text(out, "out")
        if os.path.isdir(out):
            raise ValidationError("out", "must be the path of a file to write (not a directory)")
        for name, value in (("until_seq", until_seq), ("as_of_ns", as_of_ns)):
            if value is not None and (type(value) is not int or not 0 <= value < 1 << 63):
                raise ValidationError(name, f"must be an integer from 0 to 2**63-1 or None, got {value!r:.40}")
        folder = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(folder):  # as the CLI: nothing creates missing folders
            raise ValidationError("out", f"the folder {folder} does not exist or is not a folder",
                                  hint="create it first (nothing is created for you)")
        return self._need_projector().rebuild("all", until_seq=until_seq, as_of_ns=as_of_ns, out_path=out,
                                              progress=progress)

    def health(self, full: bool = True) -> dict[str, Any]:
        """The projections' health (``{"ok", "state": {"status", ...}, "fts": {...}}``); reads only."""
        return self._need_projector().health(full=full)

    def projection_lag(self) -> int:
        """How many events of the log the projections have not applied yet."""
        return max(0, self.log.head()[0] - self._need_projector().cursor())

    # ------------------------------------------------------------------ reads

    def sync(self, timeout: float | None = 10.0) -> int:
        """Wait until the read model has reached the log head as of this call; returns that seq.
        When waiting cannot help — another process holding the projector lease is stopped, the
        disk is full, the log is damaged — returns the seq the read model did reach, below the
        head (reads then say ``stale``); :class:`ProjectionError` when ``timeout`` ran out."""
        self._check()
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 <= timeout < 1e9):
            raise ValidationError("timeout", "must be a number of seconds, 0 or more, or None")
        head = self.log.head()[0]
        reach = self._reads.advance(head, wait=timeout)
        if reach is not None and not getattr(reach, "done", True):
            return int(getattr(reach, "cursor"))  # it answered the head before, and a caller took stale rows for current
        return head

    @typed_read
    def get_session(self, session_id: str) -> dict[str, Any] | None:
        """The session (docs/EVENTS.md "Read models"), or None when it does not exist or was deleted."""
        return self._fresh().get_session(session_id)

    @typed_read
    def list_sessions(self, *, source: str | None = None, archived: bool | None = False,
                      pinned: bool | None = None, hidden: bool | None = False, children: bool = True,
                      workspace: str | None = None, limit: int | None = 50,
                      offset: int = 0) -> list[dict[str, Any]]:
        """Sessions matching every filter, most recent activity first, the page ``[offset:offset+limit]``
        (``limit=None``: all), then the matching pinned sessions outside the page (docs/EVENTS.md)."""
        if workspace == "":
            raise ValidationError("workspace", "must be a path (an empty one matched every absolute path)")
        return self._fresh().list_sessions(source=source, archived=archived, pinned=pinned, hidden=hidden,
                                           children=children, workspace=workspace, limit=limit, offset=offset)

    @typed_read
    def get_messages(self, session_id: str, *, include_inactive: bool = False, limit: int | None = None,
                     before: int | None = None, after: int | None = None,
                     newest_first: bool = False) -> list[dict[str, Any]]:
        """The session's messages (active ones unless ``include_inactive``) with
        ``after < id < before``, in chronological order (newest first with ``newest_first``).
        With ``limit``: the latest ``limit`` of them — or, paging forward (``after`` given and
        ``before`` not), the first ``limit`` after ``after``. The latest N costs O(N)."""
        return self._fresh().get_messages(session_id, include_inactive=include_inactive, limit=limit, before=before,
            after=after, newest_first=newest_first)

    @typed_read
    def get_usage(self, session_id: str) -> list[dict[str, Any]]:
        """Usage rows of the session per (model, provider, task)."""
        return self._fresh().get_usage(session_id)

    @typed_read
    def get_reactions(self, message_id: int) -> list[dict[str, Any]]:
        """Current reactions on a message, by author."""
        return self._fresh().get_reactions(message_id)

    @typed_read
    def search(self, query: str, *, role: str | None = None, source: str | None = None,
               session_id: str | None = None, limit: int | None = 20) -> dict[str, Any]:
        """Full-text search: ``{"degraded": bool, "results": [...]}``; never crosses profiles."""
        if session_id == "":
            raise ValidationError("session_id", "must be a session id (an empty one matched nothing, silently)",
                                  hint="give a session's id, or leave the filter out")
        return self._fresh().search(query, role=role, source=source, session_id=session_id, limit=limit)

    @typed_read
    def stats(self) -> dict[str, Any]:
        """Totals over live root sessions."""
        return self._fresh().stats()
