"""Follow: a background thread that keeps the projections current for every process.

While it runs it announces itself to other processes (a shared flock on ``follower.lock``,
:class:`projections.lease.Presence`): one-shot readers elsewhere then read the projections as
they stand instead of racing it for the lease (see :mod:`projections.visibility`). Each poll
it makes one attempt to bring the projections up to the log — applying the log when it can
take the lease, else noting the cursor the lease holder reached. A failing follower withdraws
its presence (readers then catch up themselves) and retries with a growing pause; it announces
itself again once a poll succeeds.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from projections.lease import Presence

log = logging.getLogger("eventlog.projections")

FOLLOW_POLL = 0.02
MAX_PAUSE_S = 5.0


class Follower:
    """Runs ``step()`` every ``poll`` seconds on a daemon thread, with this process's presence
    announced while the steps succeed. ``step`` must never wait long (it runs one attempt of
    ``Projector.advance(wait=0)``)."""

    def __init__(self, directory: Path, step: Callable[[], object]) -> None:
        self._step = step
        self._directory = directory
        self._presence = Presence(directory)
        self.stopped_by_itself = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._switch = threading.Lock()  # start and stop from several threads: one at a time
        self.failures = 0
        """Consecutive failed steps (0 while it keeps up)."""

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, poll: float = FOLLOW_POLL) -> None:
        """Start following (idempotent)."""
        with self._switch:
            if self.running:
                return
            self._stop.clear()
            self._presence.announce()
            self._thread = threading.Thread(target=self._run, args=(poll,), name="eventlog-projector", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread, then withdraw the presence. Idempotent."""
        with self._switch:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            self._presence.withdraw()

    def _run(self, poll: float) -> None:
        while not self._stop.is_set():
            if not self._directory.is_dir():
                # The profile was removed: there is nothing left to follow (and a catch-up would
                # only recreate its folder). Stop once, saying so once.
                log.warning("profile folder %s is gone: the projection follower stops", self._directory)
                self._presence.withdraw()
                self.stopped_by_itself = True
                return
            try:
                self._step()
                if self.failures:
                    self._presence.announce()
                    log.info("projection follower recovered after %d failed attempts", self.failures)
                self.failures = 0
            except Exception as e:  # keep following; the next reader or Projector.heal() reports the fault
                self.failures += 1
                self._presence.withdraw()  # a failing follower must not keep readers from catching up
                if self.failures == 1:  # one line per failure streak, never a traceback from a thread
                    log.warning("projection follower failed, retrying with backoff: %s", e)
            self._stop.wait(poll if self.failures == 0 else min(MAX_PAUSE_S, poll * 2 ** self.failures))
