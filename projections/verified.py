"""The projections are built only from the verified prefix of the log.

Every event a build or a catch-up applies is checked against the chain as it is read
(:class:`eventlog.log.damage.Verified`: seq order, canonical bytes, ``prev``, the hash
recomputed). At the first event that fails, reading stops: the projections hold everything
before it and nothing after, the damage is recorded for every process (appends then refuse),
and every read says the profile is served as of the last good seq (``degraded``, with the bad
seq). Nothing is ever skipped silently and nothing tampered with is ever served.
"""
from __future__ import annotations

from typing import Any, Iterator

from eventlog.log import Log
from eventlog.log.damage import Damage
from eventlog.log.damage import Verified as VerifiedEvents


class Verified:
    """The envelopes ``from_seq..to_seq`` of ``log``, each checked, stopping at the first bad
    one (then :attr:`damage` says where and why). ``prev``: the hash of event ``from_seq - 1``
    (64 zeros from seq 1)."""

    def __init__(self, log: Log, from_seq: int, to_seq: int, prev: str) -> None:
        self._events = VerifiedEvents(log, from_seq, to_seq, prev, raw=False)  # envelopes only

    @property
    def damage(self) -> Damage | None:
        return self._events.damage

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for _seq, _raw, env in self._events:
            yield env
