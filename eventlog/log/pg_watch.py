"""A client-side deadline for PostgreSQL statements the server received but never answers.

TCP keepalives and ``tcp_user_timeout`` notice a server whose host is gone; they cannot notice
one whose processes are frozen (SIGSTOP, a stalled VM) while its kernel still acknowledges
every packet: a call then waits until the server resumes, however long. What it cannot tell
from a slow statement is a server that still takes new connections while the backends serving
this process do not answer (only they stopped, or a disk that stalls only the backends doing I/O):
such a statement is not cut.
A statement that legitimately runs long (a wait for the profile's append lock, an erase of a
large lineage, a 1 GB batch) looks the same from the socket. So the watch does not guess from
the statement's age alone: once a statement has gone unanswered for ``answer_timeout`` seconds,
it asks the server something cheap on a new connection (a connect: the server forks a backend,
authenticates and says it is ready). A server that answers — even with an error of its own, such
as "too many clients" — is alive and the statement keeps waiting; a server that does not answer
within ``connect_timeout`` is frozen or unreachable, and the statement's connection is cut
(``shutdown`` of its socket), so the call goes on as after a lost connection: reconnecting up to
its ``reconnect_timeout``, then a typed error (an append: its outcome resolved by id, or
:class:`~eventlog.errors.OutcomeUnknownError`).

One thread per process, running while a :class:`~eventlog.log.postgres.PostgresLog` with an
``answer_timeout`` is open, watches every connection made by
:func:`~eventlog.log.pg_schema.connect` with one; a connection with none is not watched.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import psycopg

_log = logging.getLogger("eventlog.log.postgres")

TICK = 0.5
"""How often the watch looks at the statements in flight (seconds)."""


class WatchedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose waits for the server are seen by the watch."""

    answer_timeout: float | None = None
    probe_url: str = ""
    probe_connect_timeout: float = 10.0

    def wait(self, *args: Any, **kwargs: Any) -> Any:  # every blocking step of a statement goes through here
        if self.answer_timeout is None:
            return super().wait(*args, **kwargs)
        token = WATCH.enter(self)
        try:
            return super().wait(*args, **kwargs)
        finally:
            WATCH.leave(token)


class _Watch:
    """The statements in flight on watched connections, and the thread that looks at them. The
    thread runs while a log that watches its statements is open (:meth:`attach`/:meth:`detach`),
    so that none outlives the last handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[int, tuple[WatchedConnection, float]] = {}
        self._next = 0
        self._users = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._answered: dict[tuple[str, float], float] = {}  # server -> when it last answered a probe
        self.cuts = 0
        """Connections cut because their server stopped answering (for tests and diagnostics)."""

    def attach(self) -> None:
        """A log whose statements are watched was opened: the thread runs while any is."""
        with self._lock:
            self._users += 1
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,), name="eventlog-pg-watch",
                                                daemon=True)
                self._thread.start()

    def detach(self) -> None:
        """That log was closed: the last one stops the thread (at once, or after a probe in flight,
        which its connect timeout bounds)."""
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users or self._thread is None:
                return
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not threading.current_thread():
            thread.join()

    def enter(self, conn: WatchedConnection) -> int:
        with self._lock:
            self._next += 1
            self._inflight[self._next] = (conn, time.monotonic())
            return self._next

    def leave(self, token: int) -> None:
        with self._lock:
            self._inflight.pop(token, None)

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(TICK):
            try:
                self._look()
            except Exception:  # never let the watch die: log and look again
                _log.exception("the PostgreSQL statement watch failed")

    def _look(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [(tok, conn) for tok, (conn, since) in self._inflight.items()
                    if conn.answer_timeout is not None and now - since >= conn.answer_timeout]
        servers: dict[tuple[str, float], list[tuple[int, WatchedConnection]]] = {}
        for tok, conn in late:
            servers.setdefault((conn.probe_url, conn.probe_connect_timeout), []).append((tok, conn))
        for server, waiting in servers.items():
            timeout = min(c.answer_timeout or 0.0 for _, c in waiting)
            if time.monotonic() - self._answered.get(server, -1e18) < timeout:
                continue  # it answered a probe lately: these statements are slow, not lost
            if answers(*server):
                self._answered[server] = time.monotonic()
                continue
            with self._lock:  # under the lock: a wait that just ended cannot have started another statement
                for tok, conn in waiting:
                    if tok in self._inflight:
                        self.cuts += 1
                        _log.warning("PostgreSQL did not answer a statement for %g s nor a new connection within "
                                     "%g s (its processes stopped?): closing that statement's connection",
                                     conn.answer_timeout, server[1])
                        cut(conn)


def answers(url: str, connect_timeout: float) -> bool:
    """Whether the server at ``url`` answers a new connection within ``connect_timeout``: any
    reply of its own (an error with a SQLSTATE, such as too many clients or a failed password)
    counts; a timeout, a refused or reset connection does not."""
    try:
        conn = psycopg.Connection.connect(url, autocommit=True, connect_timeout=max(1, int(connect_timeout)),
                                          application_name="eventlog-probe")
    except psycopg.Error as e:
        return getattr(e, "sqlstate", None) is not None
    conn.close()
    return True


def cut(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down under the thread waiting on it: its wait wakes and
    fails as a lost connection (the connection is broken, never reused)."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # already closed
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.close()


WATCH = _Watch()


def _after_fork() -> None:  # the child has no watch thread, and the lock may have been held by it
    WATCH._lock = threading.Lock()
    WATCH._thread = None
    WATCH._users = 0  # a log opened before fork() is not usable in the child
    WATCH._inflight.clear()


os.register_at_fork(after_in_child=_after_fork)
