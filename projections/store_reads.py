"""The projections as SessionStore's read model (the ``ReadModel`` protocol of eventlog.sessions.store)."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from eventlog.log import Log
from eventlog.sessions.reads import typed_read
from projections.projector import Projector
from projections.queries import Reader
from projections.visibility import Reach, Visibility


class ProjectionReadModel:
    """A :class:`Reader` plus the projector that keeps it current.

    What each read sees is decided by the projector's :class:`Visibility`: :meth:`advance`
    gives read-your-writes; every query method first runs :meth:`Visibility.before_read`
    (which trusts this process's follower when ``follower=True`` started one, and otherwise
    applies what is new if nobody else will and the lease is free — it never waits).
    """

    def __init__(self, projector: Projector, *, follower: bool = False) -> None:
        self.projector = projector
        self.visibility: Visibility = projector.visibility
        # One connection serves both the projector's cursor checks and this model's queries
        # (a fresh one-shot open then opens state.db once for reading, not twice).
        self.reader: Reader = projector.probe_reader()
        self._local = threading.local()
        if follower:
            projector.start_follower()

    def advance(self, to_seq: int | None = None, wait: float | None = None) -> Reach:
        """Return once the projections include ``to_seq`` (None: the log head as of this call);
        raise :class:`ProjectionError` after ``wait`` seconds (default
        :data:`projections.visibility.WAIT_TIMEOUT`)."""
        return self.visibility.include(to_seq, wait)

    def peek(self) -> Reader:
        """The reader as the projections stand, without applying new events first."""
        return self.reader

    def peek_seq(self) -> int:
        """A seq the projections are known to include: what :meth:`peek` answers covers at least
        the log up to it (a writer checks the log itself past it)."""
        return int(self.projector.site.known_seq)

    def _reads(self) -> Reader:
        self._local.reach = self.visibility.before_read()
        return self.reader

    def last_reach(self) -> Reach | None:
        """How far the projections reached for this thread's last read (None before any)."""
        reach: Reach | None = getattr(self._local, "reach", None)
        return reach

    # ---- helpers writers check before appending ----------------------------------------------

    def is_live(self, session_id: str) -> bool:
        return self._reads().is_live(session_id)

    def title_holder(self, title: str) -> str | None:
        return self._reads().title_holder(title)

    def titles(self) -> set[str]:
        return self._reads().titles()

    def message_session(self, message_id: int) -> str | None:
        return self._reads().message_session(message_id)

    def current_reaction(self, message_id: int, author: str) -> str | None:
        return self._reads().current_reaction(message_id, author)

    def lineage(self, session_id: str) -> list[str]:
        return self._reads().lineage(session_id)

    def unseen_reactions(self, session_id: str) -> list[dict[str, Any]]:
        return self._reads().unseen_reactions(session_id)

    # ---- reads (checked here and by the Reader: eventlog.sessions.reads.typed_read) -----------

    @typed_read
    def get_session(self, session_id: str) -> dict[str, Any] | None:
        return self._reads().get_session(session_id)

    @typed_read
    def list_sessions(self, *, source: str | None = None, archived: bool | None = False,
                      pinned: bool | None = None, hidden: bool | None = False, children: bool = True,
                      workspace: str | None = None, limit: int | None = 50,
                      offset: int = 0) -> list[dict[str, Any]]:
        return self._reads().list_sessions(source=source, archived=archived, pinned=pinned, hidden=hidden,
                                           children=children, workspace=workspace, limit=limit, offset=offset)

    @typed_read
    def get_messages(self, session_id: str, *, include_inactive: bool = False, limit: int | None = None,
                     before: int | None = None, after: int | None = None,
                     newest_first: bool = False) -> list[dict[str, Any]]:
        return self._reads().get_messages(session_id, include_inactive=include_inactive, limit=limit, before=before,
            after=after, newest_first=newest_first)

    @typed_read
    def get_usage(self, session_id: str) -> list[dict[str, Any]]:
        return self._reads().get_usage(session_id)

    @typed_read
    def get_reactions(self, message_id: int) -> list[dict[str, Any]]:
        return self._reads().get_reactions(message_id)

    @typed_read
    def search(self, query: str, *, role: str | None = None, source: str | None = None,
               session_id: str | None = None, limit: int | None = 20) -> dict[str, Any]:
        return self._reads().search(query, role=role, source=source, session_id=session_id, limit=limit)

    @typed_read
    def stats(self) -> dict[str, Any]:
        return self._reads().stats()

    def close(self) -> None:
        try:
            self.reader.close()
        finally:
            self.projector.close()


def open_read_model(profile_dir: str | Path, log: Log, profile: str, *, follower: bool = False,
                    batch_size: int | None = None, check: bool = True, catch_up: bool = True,
                    read_models: tuple[dict[str, Any], Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
                    ) -> tuple[ProjectionReadModel, Projector]:
    """Open the projections of a profile for SessionStore: heal them if needed (``check``),
    bring them up to date (``catch_up``; else the first read does), and return
    ``(read_model, projector)``. ``read_models``: extension read models and their upcast,
    registered first, so that a state.db the heal rebuilds is built with their tables."""
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    projector = Projector(profile_dir, log, profile, **kwargs)
    try:
        if read_models is not None:
            projector.register_read_models(*read_models)
        if check:
            projector.heal(catch_up=catch_up)
        return ProjectionReadModel(projector, follower=follower), projector
    except BaseException:
        projector.close()
        raise
