"""The projections as SessionStore's read model (the ``ReadModel`` protocol of eventlog.sessions.store)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from eventlog.errors import ProjectionError
from eventlog.log import Log
from projections.projector import Projector
from projections.queries import Reader

WAIT_TIMEOUT = 30.0


class ProjectionReadModel:
    """A :class:`Reader` plus the projector that keeps it current.

    ``wait_for(seq)`` gives read-your-writes. Other processes' appends: with ``follower=True``
    a background thread applies them within 20 ms (plus apply time) whenever it can take the
    lease; otherwise every read first applies what is new if the lease is free (never waits).
    """

    def __init__(self, projector: Projector, *, follower: bool = False) -> None:
        self.projector = projector
        # One connection serves both the projector's cursor checks and this model's queries
        # (a fresh one-shot open then opens state.db once for reading, not twice).
        self.reader: Reader = projector.probe_reader()
        self._follower = follower
        if follower:
            projector.start_follower()

    def wait_for(self, seq: int, timeout: float | None = None) -> None:
        """Return once the projections include ``seq``; raise :class:`ProjectionError` after
        ``timeout`` seconds (default 30)."""
        if not self.projector.wait_for(seq, WAIT_TIMEOUT if timeout is None else timeout):
            raise ProjectionError(
                f"the projections did not reach seq {seq} in time",
                hint="another process may be rebuilding them; retry, or run `eventlog doctor`")

    def peek(self) -> Reader:
        """The reader as the projections stand, without applying new events first."""
        return self.reader

    def _reads(self) -> Reader:
        if not self._follower:
            self.projector.refresh()
        return self.reader

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self.reader, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(self._reads(), name)(*args, **kwargs)

        return call

    def close(self) -> None:
        try:
            self.reader.close()
        finally:
            self.projector.close()


def open_read_model(profile_dir: str | Path, log: Log, profile: str, *, follower: bool = False,
                    batch_size: int | None = None, check: bool = True) -> tuple[ProjectionReadModel, Projector]:
    """Open the projections of a profile for SessionStore: heal them if needed (``check``),
    catch up, and return ``(read_model, projector)``."""
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    projector = Projector(profile_dir, log, profile, **kwargs)
    try:
        if check:
            projector.ensure()
        return ProjectionReadModel(projector, follower=follower), projector
    except BaseException:
        projector.close()
        raise
