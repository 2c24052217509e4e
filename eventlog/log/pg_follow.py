"""Waking followers of a PostgreSQL log: LISTEN in every follower.

Imported only by :mod:`eventlog.log.postgres`, whose writer sends a NOTIFY right after each
COMMIT (as a transaction of its own: inside the append transaction it would take a
cluster-wide lock until the commit is flushed). A follower's listener thread LISTENs on a
connection of its own and bumps a wake generation on every notification, and on every
(re)connect, since something may have landed while it was away; this process's own commits
bump it directly. Notifications only wake: catch-up reads are the truth, and a follower whose
listener is down polls instead.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import psycopg


def quiet_close(c: psycopg.Connection[Any] | None) -> None:
    if c is not None:
        try:
            c.close()
        except Exception:  # closing a broken connection must not mask the real error
            pass


class Wakeups:
    """The listener and the wake generation of one :class:`PostgresLog` handle.

    ``connect()`` opens a plain autocommit connection; ``listen_sql`` is the quoted ``LISTEN``
    statement of the profile's channel.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], listen_sql: str) -> None:
        self._connect = connect
        self._listen_sql = listen_sql
        self._closed = False
        self._cv = threading.Condition()  # wake generation and listening state
        self.gen = 0
        self.listening = False
        self._listener: threading.Thread | None = None

    def bump(self) -> None:
        with self._cv:
            self.gen += 1
            self._cv.notify_all()

    def ensure_listener(self) -> None:
        """Start the LISTEN thread (once per handle; it reconnects by itself)."""
        with self._cv:
            if self._listener is None and not self._closed:
                self._listener = threading.Thread(target=self._listen_loop, name="eventlog-pg-listen", daemon=True)
                self._listener.start()

    def _listen_loop(self) -> None:
        delay = 0.05
        while not self._closed:
            conn = None
            try:
                conn = self._connect()
                conn.execute(self._listen_sql)
                self._set_listening(True)
                delay = 0.05
                while not self._closed:
                    for _ in conn.notifies(timeout=0.25):
                        self.bump()
            except psycopg.Error:
                self._set_listening(False)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            finally:
                quiet_close(conn)
        self._set_listening(False)

    def _set_listening(self, up: bool) -> None:
        with self._cv:
            self.listening = up
            self.gen += 1  # (re)connected or lost: followers re-read either way
            self._cv.notify_all()

    def current(self) -> int:
        with self._cv:
            return self.gen

    def wait(self, since: int, seconds: float) -> None:
        """Return when the generation moved past ``since``, after ``seconds``, or on close."""
        with self._cv:
            if self.gen == since and not self._closed:
                self._cv.wait(seconds)

    def close(self) -> None:
        """Stop the listener and wake every follower."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._listener is not None:
            self._listener.join(5)
