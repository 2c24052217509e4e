"""Visibility: what a read sees, and what it waits for first. The one place that decides it.

The projections lag the log: an append is durable in the log before any projection holds it.
Every read of a profile goes through one of two rules here before it queries:

- **Its own writes** (:meth:`Visibility.include`, read-your-writes): the projections must
  include the caller's last append. The read applies the log itself whenever the lease is
  free and otherwise watches the lease holder's cursor; it gives up after ``WAIT_TIMEOUT``
  (30 s, or the caller's own bound) with a :class:`ProjectionError` — except when the holder is
  a stopped process (SIGSTOP, Ctrl-Z): then after ``READ_WAIT_S`` it answers from the
  projections as they stand, flagged stale (a frozen process never holds readers).
- **Everyone's writes** (:meth:`Visibility.before_read`): a process that runs its own follower
  trusts it (the projections stay within its poll of the log) and reads at once — while its
  polls keep reaching the log; one short of it for ``FOLLOWER_TRUST_S`` (a stopped lease
  holder, a full disk) is not trusted, and the read goes the way of a process without one. Any other
  reader — a one-shot command, a cron job — brings the projections up to the log head as of
  the read: it applies the log itself when the lease is free, and otherwise waits for the
  lease holder, at most ``READ_WAIT_S``. So a process that starts after another one wrote
  always reads what it wrote (writers need not settle their appends before they exit), and a
  lease holder that is stopped or hung delays a read by at most ``READ_WAIT_S``: the read then
  answers from the projections as they stand and says so (``Reach.stale``).

Both rules bring the projections up through one verb, :meth:`Projector.advance`, and both
answer with a :class:`Reach`: how far the projections are known to go, against what the caller
needed.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.errors import ProjectionError, process_state

if TYPE_CHECKING:
    from projections.projector import Projector

WAIT_TIMEOUT = 30.0
"""How long a read waits for its own writes before it gives up."""
READ_WAIT_S = 0.5
"""How long a read without a follower of its own waits for another process's catch-up (the lease
holder's) before it answers from the projections as they stand, flagged stale."""
STUCK_MEMO_S = 5.0
"""After a read ran out of time, the next reads of the same process (a command reads several
times) do not wait again while the log head and the cursor stand still, for this long: a stopped
lease holder delays a command by READ_WAIT_S once, not once per read."""


@dataclass(frozen=True)
class Reach:
    """Where the projections stand for one caller.

    ``target``: the seq the caller needed them to include; ``cursor``: a seq they are known to
    include (this process's knowledge: another process may have applied more since);
    ``follower``: the caller left the difference to a live follower (its lag is bounded by its
    poll plus apply time) rather than applying it."""

    target: int
    cursor: int
    follower: bool = False

    @property
    def done(self) -> bool:
        """The projections include ``target``."""
        return self.cursor >= self.target

    @property
    def stale(self) -> bool:
        """Short of ``target`` with no follower trusted to close the gap."""
        return not self.done and not self.follower


class Visibility:
    """The visibility rules for reads through one :class:`Projector` (any number of read
    models and threads may share it: it keeps no per-caller state; read-your-writes takes the
    caller's own last seq as an argument)."""

    def __init__(self, projector: Projector) -> None:
        self._projector = projector
        self._stuck: tuple[int, int, float] | None = None  # (head, cursor, until): the last read that ran out

    def include(self, seq: int | None = None, wait: float | None = None) -> Reach:
        """Read-your-writes: return once the projections include ``seq`` (None: the log head as
        of this call), applying the log here whenever the lease is free. Raises
        :class:`ProjectionError` when they do not get there within ``wait`` seconds (default
        ``WAIT_TIMEOUT``)."""
        p = self._projector
        site = p.site
        deadline = time.monotonic() + (WAIT_TIMEOUT if wait is None else wait)
        reach = p.advance(seq, wait=min(READ_WAIT_S, max(0.0, deadline - time.monotonic())))
        while not reach.done and not site.halt and not self._holder_stopped():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            reach = p.advance(seq, wait=min(1.0, left))  # a holder stopped meanwhile is noticed within 1 s
        if not reach.done and (site.halt or (site.damage is not None and site.damage.seq <= reach.target)
                               or self._holder_stopped()):
            # A full disk, a damaged log, or a lease holder that is stopped (SIGSTOP, Ctrl-Z, a
            # debugger): waiting cannot help, and a frozen process must not hold readers. The read
            # serves what there is and says so (stale).
            return reach
        if not reach.done:
            raise ProjectionError(
                f"the projections did not reach seq {reach.target} in time",
                hint="another process may be rebuilding them; retry, or run `eventlog doctor`")
        return reach

    def _holder_stopped(self) -> bool:
        """The projector lease is held by another process that is stopped (state T)."""
        holder = self._projector.lease_holder()
        return holder is not None and holder != os.getpid() and process_state(holder) == "stopped"

    def before_read(self, wait: float = READ_WAIT_S) -> Reach:
        """Before a read of the profile: trust this process's follower if it runs one; else bring
        the projections up to the log head as of this call, waiting at most ``wait`` seconds for
        another lease holder (``Reach.stale`` when that ran out)."""
        p = self._projector
        site = p.site
        if p.following and p.follower_keeps_up():
            return Reach(site.known_seq, site.known_seq, follower=True)
        target = site.log.head()[0]
        stuck = self._stuck
        if stuck is not None and stuck[:2] == (target, site.known_seq) and time.monotonic() < stuck[2]:
            wait = 0.0  # the holder made no progress since the last read ran out: one attempt, no new wait
        reach = p.advance(target, wait=wait)
        if not reach.stale:
            self._stuck = None
        elif wait > 0:
            self._stuck = (target, reach.cursor, time.monotonic() + STUCK_MEMO_S)
        return reach
