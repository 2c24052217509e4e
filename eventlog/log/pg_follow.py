"""Waking followers of a PostgreSQL log: NOTIFY after each commit, LISTEN in every follower.

Imported only by :mod:`eventlog.log.postgres`. A NOTIFY is never sent inside the append
transaction (there it would take a cluster-wide lock until the commit is flushed): a notifier
thread sends it on a connection of its own once the commit returned, and coalesces a burst of
commits into one NOTIFY carrying the highest seq. A follower's listener thread LISTENs on
another connection and bumps a wake generation on every notification, and on every
(re)connect, since something may have landed while it was away. Notifications only wake:
catch-up reads are the truth, and a follower whose listener is down polls instead.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import psycopg

NOTIFY_SQL = "SELECT pg_notify(%s, %s)"


def quiet_close(c: psycopg.Connection[Any] | None) -> None:
    if c is not None:
        try:
            c.close()
        except Exception:  # closing a broken connection must not mask the real error
            pass


class Wakeups:
    """The notifier, the listener and the wake generation of one :class:`PostgresLog` handle.

    ``connect()`` opens a plain autocommit connection; ``channel`` is the profile's channel;
    ``listen_sql`` the quoted ``LISTEN`` statement of it.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], channel: str, listen_sql: str) -> None:
        self._connect = connect
        self._channel = channel
        self._listen_sql = listen_sql
        self._closed = False
        self._cv = threading.Condition()  # wake generation and listening state
        self.gen = 0
        self.listening = False
        self._listener: threading.Thread | None = None
        self._ncv = threading.Condition()  # notifier queue
        self._want = 0
        self._sent = 0
        self._notifier: threading.Thread | None = None

    # ---- this process's commits

    def announce(self, seq: int) -> None:
        """After a commit up to ``seq``: wake this process's followers now, other hosts' by NOTIFY."""
        self.bump()
        if seq <= 0:
            return
        with self._ncv:
            self._want = max(self._want, seq)
            if self._notifier is None and not self._closed:
                self._notifier = threading.Thread(target=self._notify_loop, name="eventlog-pg-notify", daemon=True)
                self._notifier.start()
            self._ncv.notify()

    def _notify_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        delay = 0.05
        while True:
            with self._ncv:
                while self._want <= self._sent and not self._closed:
                    self._ncv.wait()
                seq = self._want
                if seq <= self._sent:  # closed with nothing left to announce
                    break
            try:
                if conn is None or conn.closed or conn.broken:
                    quiet_close(conn)
                    conn = None
                    conn = self._connect()
                conn.execute(NOTIFY_SQL, (self._channel, str(seq)))
                with self._ncv:
                    self._sent = max(self._sent, seq)
                delay = 0.05
            except psycopg.Error:
                quiet_close(conn)
                conn = None
                if self._closed:
                    break  # followers elsewhere fall back to polling
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        quiet_close(conn)

    # ---- following

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
        """Stop both threads; the notifier sends what is still pending first."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        with self._ncv:
            self._ncv.notify_all()
        for t in (self._notifier, self._listener):
            if t is not None:
                t.join(5)
