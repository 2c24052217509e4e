"""The adapters' view of a shared SessionStore: one handle per adapter object.

``SessionStore.open`` is cheap for a profile already open in the process (the stores share one
log, projector and follower), so each adapter object simply opens its own handle and closes it
when done; these helpers keep the adapters' calls in one place.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from typing import Any, Awaitable, Iterator, Sequence, TypeVar

from eventlog.errors import ValidationError
from eventlog.log import Log, check_target
from eventlog.profiles import DEFAULT_PROFILE
from eventlog.sessions.events import make_event
from eventlog.sessions.extensions import Extension
from eventlog.sessions.store import SessionStore

_T = TypeVar("_T")
LogArg = str | Log | None


def acquire(home: str | os.PathLike[str] | None = None, profile: str = DEFAULT_PROFILE,
            extensions: Sequence[Extension] = (), *, follower: bool = True, log: LogArg = None) -> SessionStore:
    """A store handle on ``(home, profile)`` with ``extensions`` registered; ``follower`` and
    ``log`` (where the profile's events live) as for :meth:`SessionStore.open` (the background
    thread runs while any handle of the profile in the process asked for it)."""
    return SessionStore.open(None if home is None else os.fspath(home), profile, log=log,
                             extensions=list(extensions) if extensions else None, follower=follower)


def check_log(log: object) -> LogArg:
    """An adapter's ``log=`` argument, checked when the adapter is made (the store opens later,
    on first use): None, a ``postgresql://`` URL or an LMDB log directory, or a Log object."""
    if log is None or isinstance(log, Log):
        return log
    if isinstance(log, os.PathLike):
        log = os.fsdecode(log)
    if not isinstance(log, str):
        raise ValidationError("log", f"must be a postgresql:// URL, a log directory or an eventlog.log.Log, "
                                     f"got {type(log).__name__}")
    check_target(log)  # an empty one, another scheme, a key=value string: now, not at the first call
    return log


def release(store: SessionStore) -> None:
    """Close the handle (the shared log and projector close with the last one)."""
    store.close()


def profile_of(store: SessionStore) -> object:
    """What every handle of ``store``'s open profile in this process shares (and no other
    profile, nor the same profile opened again after it closed): a key for what an adapter
    keeps per open profile (compare it by identity; hold it weakly)."""
    return store._core


def projected_live(store: SessionStore, session_id: str) -> int:
    """A seq up to which the session was live — created, and neither deleted (nor any ancestor)
    nor erased — by the projections as they stand, read without waiting for them (another
    process may hold them, rebuilding); 0 when they do not say so (not live there, not there
    yet, or no projections). A session never comes back, so whatever the stream holds after
    that seq decides the rest."""
    reads = store._reads
    peek, seen = getattr(reads, "peek", None), getattr(reads, "peek_seq", None)
    if peek is None or seen is None:
        return 0
    try:
        # Before the read, what it answers covers at least this much: what this process knows
        # the projections hold, or what their files say (a process that just opened them).
        upto = max(int(seen()), store.log.head()[0] - store.projection_lag())
        return upto if peek().is_live(session_id) else 0
    except Exception:  # noqa: BLE001 - a projection file going away under the bare reader (a
        # rebuild or a deletion elsewhere) only means: read the whole stream instead
        return 0


def append_counted(store: SessionStore, events: list[dict[str, Any]], expected_version: int) -> list[int]:
    """Append catalogue events of one session stream at ``expected_version``, checked by their
    types' validators and by that version alone: no read model is asked (it may lag the log,
    or wait for another process's rebuild). For an adapter that decided the events from the
    stream as the log holds it at that version — the version refuses the append
    (:class:`ConcurrencyError`, nothing written) when the stream changed since, its deletion or
    erase included. Returns the seqs; the store's read-your-writes counts them."""
    batch = [make_event(e["type"], e["session"], e["data"]) for e in events]
    if len({e["session"] for e in batch}) != 1:
        raise ValueError("append_counted takes the events of one session stream")
    seqs = store._append(batch, expected_version=expected_version)
    store._live.pop(batch[0]["session"], None)  # its stream grew: the store's next append reads the version again
    return seqs


@contextlib.contextmanager
def ruled(store: SessionStore) -> Iterator[None]:
    """The profile's rules lock across the processes of the host (``SessionStore._ruled``, the
    read model brought up to the log inside it): every deletion and erase commits under it, so
    none lands between a check made inside and an append made inside."""
    with store._ruled():
        yield


def erased(store: SessionStore, session_id: str) -> bool:
    """Whether stream ``session_id`` was erased, from the log (the store erases whole streams:
    its first event is then an erased one). False for an empty stream."""
    events = store.log.read_session(session_id)
    try:
        first = next(iter(events), None)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
    return first is not None and first.get("erased") is True


def append_events(store: SessionStore, events: list[dict[str, Any]], expected_version: int | None = None) -> list[int]:
    """``store.append_events`` (extension events into the profile's log)."""
    return store.append_events(events, expected_version=expected_version)


@contextlib.contextmanager
def read_model(store: SessionStore, name: str) -> Iterator[sqlite3.Connection]:
    """``store.read_model(name)``: a connection caught up to the process's writes."""
    with store.read_model(name) as conn:
        yield conn


def references(store: SessionStore) -> int:
    """How many handles share ``store``'s profile in this process (0 once it is closed); for tests."""
    return 0 if store._closed else store._core.refs


async def settled(work: Awaitable[_T]) -> _T:
    """Await a mutation to its end even when the caller is cancelled meanwhile, then re-raise the
    cancellation: the caller never sees a cancelled call whose outcome is still open (its worker
    thread writing on after the caller moved on: a LangGraph write cancelled by a timeout landed
    after the caller's ``adelete_thread`` and brought the thread back; outside audit, helper-67)."""
    job = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not job.done():
        try:
            await asyncio.wait({job})
        except asyncio.CancelledError as e:
            cancelled = cancelled or e
    if cancelled is not None:
        if not job.cancelled():
            job.exception()  # retrieved, so the loop does not report it as never retrieved
        raise cancelled
    return job.result()
