"""Visibility: what a read sees, and what it waits for first. The one place that decides it.

The projections lag the log: an append is durable in the log before any projection holds it.
Every read of a profile goes through one of two rules here before it queries:

- **Its own writes** (:meth:`Visibility.include`, read-your-writes): the projections must
  include the caller's last append. The read applies the log itself whenever the lease is
  free and otherwise watches the lease holder's cursor; it gives up after ``WAIT_TIMEOUT``
  (30 s, or the caller's own bound) with a :class:`ProjectionError`.
- **Everyone else's writes** (:meth:`Visibility.before_read`): the read never waits. It trusts
  a live follower — this process's own (which keeps them within its poll), or another
  process's unless that one is overdue (the oldest event it has not applied was appended more
  than ``FOLLOWER_OVERDUE_S`` ago: stopped or starved) — and reads the projections as they
  stand, so a one-shot reader costs the same whether 0 or 1,000 events came in since the last
  one. With no follower to trust it applies the log itself if the lease is free, and reads as
  things stand if it is not.

Both rules bring the projections up through one verb, :meth:`Projector.advance`, and both
answer with a :class:`Reach`: how far the projections are known to go, against what the caller
needed. ``Reach.stale`` is True when a read would miss events that nobody is known to be
applying (the lease is busy and no follower is trusted): what an honest read reports.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.errors import ProjectionError
from projections.lease import followed

if TYPE_CHECKING:
    from projections.projector import Projector

WAIT_TIMEOUT = 30.0
"""How long a read waits for its own writes before it gives up."""
FOLLOWER_OVERDUE_S = 0.25
"""A one-shot reader leaves catching up to a live follower unless the oldest event not yet
applied was appended longer ago than this (a stopped or starved follower): then it applies the
log itself, so its reads are never staler than this plus its own catch-up."""


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

    def include(self, seq: int | None = None, wait: float | None = None) -> Reach:
        """Read-your-writes: return once the projections include ``seq`` (None: the log head as
        of this call), applying the log here whenever the lease is free. Raises
        :class:`ProjectionError` when they do not get there within ``wait`` seconds (default
        ``WAIT_TIMEOUT``)."""
        reach = self._projector.advance(seq, wait=WAIT_TIMEOUT if wait is None else wait)
        if not reach.done:
            raise ProjectionError(
                f"the projections did not reach seq {reach.target} in time",
                hint="another process may be rebuilding them; retry, or run `eventlog doctor`")
        return reach

    def before_read(self) -> Reach:
        """Before a read of the profile as it stands: bring the projections up to the log head
        unless a live follower is trusted to; never waits."""
        p = self._projector
        site = p.site
        if p.following:
            return Reach(site.known_seq, site.known_seq, follower=True)
        head = site.log.head()[0]
        if site.known_seq >= head:
            return Reach(head, site.known_seq)
        site.known_seq = max(site.known_seq, p.cursor())  # another process may have applied it
        if site.known_seq >= head:
            return Reach(head, site.known_seq)
        if followed(site.dir) and not self._overdue():
            return Reach(head, site.known_seq, follower=True)
        return p.advance(head, wait=0)

    def _overdue(self) -> bool:
        """True when the oldest event the projections lack is older than FOLLOWER_OVERDUE_S."""
        site = self._projector.site
        env = site.log.get(site.known_seq + 1)
        ts = env.get("ts") if env else None
        return isinstance(ts, int) and time.time_ns() - ts > FOLLOWER_OVERDUE_S * 1e9
