"""One log append for the writes to a thread that arrive while its previous append is syncing.

LangGraph runs a step's ``put_writes`` and the next ``put`` of the same thread at once in its
background executor (a turn of a one-node graph is four checkpoints and two sets of writes,
mostly overlapping). The log's group commit only merges requests already queued when a commit
starts, so each of them paid its own synced commit. Here the writes to one stream queue behind
the append in flight; when it is durable, the first of those waiting takes every write queued by
then and appends them as one atomic batch — one commit, one sync — and each caller returns once
that batch is durable, as before. A caller never waits for a write that arrives after its own.

A batch that the log refuses as invalid (a :class:`ValidationError`: nothing appended) gives
the caller whose event it names (``events[i]``) its own try alone and appends the others again
as one batch, so each caller gets its own answer and one bad write does not cost the others a
commit each; a refusal that names no event is retried one caller at a time. Any other failure
is every caller's of the batch.
"""
from __future__ import annotations

import re
import threading
from typing import Any, Callable


class Request:
    """One caller's events and what it hands the append (``change``).

    ``events`` is never changed: the append derives what each attempt sends from it and records
    that in ``sent`` (None: the events as they are), in which a refusal's ``events[i]`` is found.
    A request may be tried again alone or in a smaller batch, and what an earlier attempt left
    out for the others' sake (a thread's creation another request carried) must be back then."""

    __slots__ = ("events", "sent", "change", "woken", "done", "error")

    def __init__(self, events: list[dict[str, Any]], change: Any) -> None:
        self.events = events
        self.sent: list[dict[str, Any]] | None = None
        self.change = change
        self.woken = threading.Event()
        self.done = False
        self.error: BaseException | None = None


Append = Callable[[str, list[Request]], None]
"""Appends the requests' events in one batch (raising as the log does)."""


class Combiner:
    """Per stream, a queue of requests and whether an append is in flight."""

    def __init__(self, append: Append) -> None:
        self._append = append
        self._mu = threading.Lock()
        self._queues: dict[str, list[Request]] = {}

    def write(self, sid: str, events: list[dict[str, Any]], change: Any) -> None:
        """Append ``events`` (stream ``sid``), batched with the writes queued beside them."""
        me = Request(events, change)
        with self._mu:
            queue = self._queues.get(sid)
            if queue is None:  # nothing in flight: lead at once
                self._queues[sid] = []
                lead = True
            else:
                queue.append(me)
                lead = False
        if not lead:
            me.woken.wait()
            if me.done:
                if me.error is not None:
                    raise me.error
                return
        self._lead(sid, me)
        if me.error is not None:
            raise me.error

    def _lead(self, sid: str, me: Request) -> None:
        """Append ``me`` and everything queued behind the previous append, then hand on."""
        with self._mu:
            queue = self._queues[sid]
            batch = [me, *queue]
            queue.clear()
        try:
            self._run(sid, batch)
        finally:
            nxt: Request | None = None
            with self._mu:
                queue = self._queues[sid]
                if queue:
                    nxt = queue.pop(0)  # it leads the next batch with whatever queued behind it
                else:
                    del self._queues[sid]
            for r in batch:
                r.done = True
                if r is not me:
                    r.woken.set()
            if nxt is not None:
                nxt.woken.set()

    def _run(self, sid: str, batch: list[Request]) -> None:
        from eventlog.errors import ValidationError

        while batch:
            try:
                self._append(sid, batch)
                return
            except ValidationError as e:
                if len(batch) == 1:
                    batch[0].error = e
                    return
                bad = _culprit(batch, e)
                if bad is None:
                    break
                try:  # nothing was appended: the one it names alone (its own answer), the rest together
                    self._append(sid, [bad])
                except BaseException as own:
                    bad.error = own
                batch = [r for r in batch if r is not bad]
            except BaseException as e:
                for r in batch:
                    r.error = e
                return
        for r in batch:  # a refusal that names no event: each on its own, each with its own answer
            try:
                self._append(sid, [r])
            except BaseException as own:
                r.error = own


def _culprit(batch: list[Request], error: BaseException) -> Request | None:
    """The request whose event ``error`` names (``events[i]...``: the index in the events the
    refused attempt sent, requests in order), or None when it names none."""
    m = re.match(r"events\[(\d+)\]", str(getattr(error, "field", "")))
    if m is None:
        return None
    i = int(m.group(1))
    for r in batch:
        sent = r.events if r.sent is None else r.sent
        if i < len(sent):
            return r
        i -= len(sent)
    return None
