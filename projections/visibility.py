"""Visibility: what a read sees, and what it waits for first. The one place that decides it.

The projections lag the log: an append is durable in the log before any projection holds it.
Every read of a profile goes through one of two rules here before it queries:

- **Its own writes** (:meth:`Visibility.include`, read-your-writes): the projections must
  include the caller's last append. The read applies the log itself whenever the lease is
  free and otherwise watches the lease holder's cursor; it gives up after ``WAIT_TIMEOUT``
  (30 s, or the caller's own bound) with a :class:`ProjectionError`.
- **Everyone's writes** (:meth:`Visibility.before_read`): a process that runs its own follower
  trusts it (the projections stay within its poll of the log) and reads at once. Any other
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

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.errors import ProjectionError

if TYPE_CHECKING:
    from projections.projector import Projector

WAIT_TIMEOUT = 30.0
"""How long a read waits for its own writes before it gives up."""
READ_WAIT_S = 0.5
"""How long a read without a follower of its own waits for another process's catch-up (the lease
holder's) before it answers from the projections as they stand, flagged stale."""


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

    def before_read(self, wait: float = READ_WAIT_S) -> Reach:
        """Before a read of the profile: trust this process's follower if it runs one; else bring
        the projections up to the log head as of this call, waiting at most ``wait`` seconds for
        another lease holder (``Reach.stale`` when that ran out)."""
        p = self._projector
        site = p.site
        if p.following:
            return Reach(site.known_seq, site.known_seq, follower=True)
        return p.advance(site.log.head()[0], wait=wait)
