"""The log contract, and the parts of it every backend shares.

A log is an append-only sequence of hash-chained events (see :mod:`eventlog.log.codec` for the
envelope). :class:`Log` is the protocol every consumer types against — the session store, the
projector, exports, imports, health checks and the CLI — and every backend implements it
(:mod:`eventlog.log.memory`, the reference; :mod:`eventlog.log.lmdb`, the durable one). What
does not depend on how events are stored is written here once: the input checks of a batch
(:func:`prepare_batch`), the chain check (:func:`verify_chain`), and ``follow``/``verify`` on top
of a backend's ``read``/``head`` (:class:`LogBase`). The contract itself is executable:
:mod:`eventlog.log.contract` holds the tests a backend must pass.

Nothing in this package knows about sessions, SQLite or projections.
"""
from __future__ import annotations

import abc
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence, runtime_checkable

from eventlog.errors import ClosedError, IntegrityError, OutcomeUnknownError, ValidationError
from eventlog.log import codec

FOLLOW_POLL_S = 0.02
"""How often ``follow`` looks for appends made by other processes (a cheap head check)."""


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :meth:`Log.verify` (the JSON of ``eventlog log verify``).

    ``first_bad_seq`` is the first seq whose bytes, order or presence do not match the chain
    (``None`` when ``ok``); ``reason`` says what is wrong with it.
    """

    ok: bool
    events: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None
    reason: str | None
    erased: int = 0
    """Events whose content was erased (their place in the chain verified, and each named with
    its hash by a later ``log.erased`` event; their own hash can no longer be recomputed)."""
    unerased: int = 0
    """Events a ``log.erased`` record names that the log still holds whole: not damage (the chain
    verifies), but words an erase meant to remove. A copy or import made by a release before
    2026-12-07 brought the record without stubbing what it names; erasing those sessions
    again (``unerased_sessions``) removes them."""
    unerased_sessions: list[str] = field(default_factory=list)
    """The sessions of those events (an event of no session is counted, not named)."""
    unerased_named: dict[int, str] = field(default_factory=dict, repr=False)
    """What :func:`verify_chain` leaves for :meth:`name_unerased` (not in :meth:`to_dict`): seq ->
    hash of what ``log.erased`` records name that the pass did not see erased for them -- an
    event held whole, or one an earlier record named already (an erase repeated after such a
    mirror), or something no erase names by its hash."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["unerased_named"]
        return out

    def name_unerased(self, get: Callable[[int], dict[str, Any] | None]) -> VerifyResult:
        """A copy with :attr:`unerased` and :attr:`unerased_sessions` from the events at the seqs
        of :attr:`unerased_named` (``get``: the log's own): those held whole, with the hash the
        record names, that are not themselves erase records -- the rule by which an import stubs
        what a record names (:func:`named_unerased`). A record naming a seq with another hash, or
        an erase record (never erased), named an innocent session or an event no erase can take,
        and doctor stayed unfinished (outside audit, helper-84)."""
        count, named = 0, set()
        for q, digest in self.unerased_named.items():
            env = get(q)
            if env is None or not held_whole(env, digest):
                continue
            count += 1
            if isinstance(env.get("session"), str):
                named.add(env["session"])
        return replace(self, unerased=count, unerased_sessions=sorted(named), unerased_named={})


@runtime_checkable
class Log(Protocol):
    """What every log backend promises (and :mod:`eventlog.log.contract` checks).

    Events are appended atomically per call and get gapless seqs from 1, assigned with the
    timestamp and the chain hashes inside the backend's write transaction. No method rewrites
    or deletes an event. Reads stream in bounded chunks. All methods are thread-safe; a closed
    log raises :class:`~eventlog.errors.ClosedError`.
    """

    @property
    def path(self) -> Path | None:
        """Where the log's storage lives on this machine (None when it has no local path)."""
        ...

    @property
    def profile(self) -> str | None:
        """The profile the log belongs to, when it records one."""
        ...

    @property
    def durability(self) -> str:
        """What an acknowledged append survives (backend-specific name, e.g. "sync")."""
        ...

    def append(self, events: Iterable[Any], expected_version: int | None = None) -> list[int]:
        """Append ``events`` (``{"type", "session"?, "data", "id"?, "v"?}`` each) atomically once
        durable; return their seqs. A caller id already stored with the same content returns its
        original seq and writes nothing; with other content raises ``DuplicateEventError``.
        ``expected_version`` (events the single session stream of the batch holds) raises
        ``ConcurrencyError`` on a mismatch, and on a stream that was erased (its first and last
        events are stubs: an erase changes no count, and the stream is not the one the caller
        counted; the LMDB and memory logs). Bad input raises ``ValidationError`` naming the field."""
        ...

    def append_sealed(self, raws: Sequence[bytes]) -> int:
        """Append already-sealed events verbatim (they must continue this log's chain exactly);
        all or nothing, ``IntegrityError`` naming the first that does not fit."""
        ...

    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last event; ``(0, 64 zeros)`` when empty."""
        ...

    def get(self, seq: int) -> dict[str, Any] | None:
        """The envelope at ``seq``, or None."""
        ...

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        """Envelopes with ``from_seq <= seq <= to_seq`` in seq order (``raw=True``: ``(seq, bytes)``)."""
        ...

    def read_session(self, session_id: str, *, after: int = 0) -> Iterator[dict[str, Any]]:
        """The envelopes of one session stream in seq order (only those with ``seq > after``)."""
        ...

    def stream_version(self, session: str) -> int:
        """How many events the session stream holds (0 when unknown)."""
        ...

    def event_seq(self, event_id: str) -> int | None:
        """The seq of the event with this id, or None."""
        ...

    def follow(self, from_seq: int = 1, timeout: float | None = None, *,
               poll: float = FOLLOW_POLL_S) -> Iterator[dict[str, Any]]:
        """Envelopes from ``from_seq`` on, waiting for new ones; stops after ``timeout`` seconds
        without one, or when the log closes."""
        ...

    def verify(self) -> VerifyResult:
        """Recompute the whole chain and name the first seq that does not match."""
        ...

    def erase(self, seqs: Sequence[int], data: dict[str, Any], *, streams: Sequence[str] = ()) -> int:
        """Make the content of the events at ``seqs`` unrecoverable and append one ``log.erased``
        event recording them (``data`` plus ``erased``: ``[[seq, hash], ...]``), atomically; the
        chain still verifies. Events already erased are skipped. ``streams``: also every event
        of these session streams as of the erase (read inside its transaction, so none appended
        between a caller's read and the erase is left). Returns the erase event's seq."""
        ...

    def size_bytes(self) -> int:
        """Bytes the log's storage uses."""
        ...

    def close(self) -> None:
        """Release the log; idempotent."""
        ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


def seq_arg(value: Any, field: str, *, optional: bool = False) -> Any:
    """``value`` when it is an int seq (or None when ``optional``), else :class:`ValidationError`
    naming ``field`` — a read given a string or a float fails as clearly as a bad append."""
    if (value is None and optional) or (type(value) is int and -(1 << 63) <= value < (1 << 63)):
        return value
    if type(value) is int:
        raise ValidationError(field, "must be an integer seq within 64 bits")
    raise ValidationError(field, f"must be an integer seq, got {type(value).__name__}")


def str_arg(value: Any, field: str) -> str:
    """``value`` when it is a string (a session or event id to look up), else :class:`ValidationError`."""
    if isinstance(value, str):
        if not value.isascii():  # ids are ASCII; other text is looked up, if it can be encoded
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValidationError(field, "contains a lone surrogate (no stored id holds one)") from None
        return value
    raise ValidationError(field, f"must be a string, got {type(value).__name__}")


def interrupted(where: str, e: BaseException, items: Sequence[codec.Prepared]) -> OutcomeUnknownError:
    """What each caller of a group commit hears when a KeyboardInterrupt or SystemExit (a signal
    handler) stopped the thread committing it: the outcome is unknown, and its ``items``' ids let
    it append them again once (they were given seqs before the commit; returned, those read as
    stored)."""
    return OutcomeUnknownError(
        f"append to {where} was interrupted ({type(e).__name__}) in the thread committing it, so whether the "
        "events were stored is unknown", [it.id for it in items],
        hint="append the same events again with these ids (event_ids): ids are idempotency keys, so a retry "
             "returns the original seqs if they were stored and appends them once if not")


def check_sealed(raw: bytes | memoryview, seq: int, prev: str) -> dict[str, Any]:
    """The envelope of the imported event ``raw`` (``append_sealed``), which must be stored as
    event ``seq`` chained after ``prev`` and be an event an append could write; IntegrityError
    (nothing of the batch is stored) otherwise. Shared by every log's append_sealed."""
    env, reason = codec.check_stored(bytes(raw), seq, prev)
    if reason is not None or env is None:
        raise IntegrityError(f"imported event {seq} does not continue the chain: {reason}")
    if (problem := codec.sealed_problem(env)) is not None:
        raise IntegrityError(f"imported event {seq} cannot be stored: {problem}")
    return env


def prepare_batch(events: Iterable[Any], expected_version: int | None) -> list[codec.Prepared]:
    """Validate and encode one append call's input, before any transaction.

    Raises :class:`ValidationError` naming the field: a bad event (``events[i].<field>``), an
    id given twice in one batch, or an ``expected_version`` that is not a non-negative integer
    or is given for a batch that does not belong to exactly one session.
    """
    if isinstance(events, (str, bytes, bytearray, dict)) or not hasattr(events, "__iter__"):
        raise ValidationError("events", f"must be a list of event objects, got {type(events).__name__}")
    items = [codec.prepare(e, i) for i, e in enumerate(events)]
    if len(items) > 1 and len({it.id for it in items}) != len(items):
        raise ValidationError("events.id", "the same event id appears twice in one batch")
    if expected_version is not None:
        if type(expected_version) is not int or expected_version < 0:
            raise ValidationError("expected_version", "must be a non-negative integer")
        streams = {it.session for it in items}
        if items and (len(streams) != 1 or None in streams):
            raise ValidationError("expected_version", "needs a batch whose events all belong to one session")
    return items


VERIFY_CATCH_UP_ROUNDS = 64
"""How many times a verify reads on when the head moved past what it read (live appends)."""


def verify_chain(stored: Iterable[tuple[int, bytes]], head: Callable[[], tuple[int, str]],
                 more: Callable[[int], Iterable[tuple[int, bytes]]] | None = None) -> VerifyResult:
    """Check a log's stored events (``(seq, bytes)`` in seq order) and its recorded head.

    Seqs gapless from 1, each ``prev`` the previous ``hash``, each hash recomputed from the
    event's bytes, stored bytes canonical, and the recorded head naming the last event. The
    first failure is reported with its seq: a missing event by the seq that should be there; a
    head that records more events than are stored, by the first missing one; a head that
    records fewer, or another hash, by the last event it fails to name.

    ``more(seq)``: the stored events from ``seq`` on, read anew. A log written while it is
    verified has a head beyond the events the pass read (they were appended after their
    chunk was read); the pass then reads on from there until it reaches the head, so live
    appends are verified too rather than reported missing. Without ``more`` (a snapshot) a
    head beyond the events is a missing event.
    """
    expect, prev, events, erased = 1, codec.ZERO_HASH, 0, 0
    pending: dict[int, str] = {}  # erased events not yet named by a log.erased event: seq -> hash
    # What a log.erased event names that was not pending for it: seq -> hash. Looked at after the
    # pass (VerifyResult.name_unerased): as many as such records name, not one per erased event.
    named: dict[int, str] = {}

    def bad(seq: int, reason: str) -> VerifyResult:
        hseq, hhash = head()
        return VerifyResult(False, events, hseq, hhash, seq, reason, erased)

    def check(batch: Iterable[tuple[int, bytes]]) -> VerifyResult | None:
        nonlocal expect, prev, events, erased
        for seq, raw in batch:
            if seq != expect:
                return bad(expect, f"event {expect} is missing (next stored seq is {seq})")
            env, reason = codec.check_stored(raw, seq, prev)
            if reason is not None or env is None:
                return bad(seq, reason or "unreadable event")
            if codec.is_stub(env):
                pending[seq] = env["hash"]
                erased += 1
            elif env.get("type") == codec.ERASED_TYPE:
                for q, digest in erased_pairs(env):
                    if pending.get(q) == digest:
                        del pending[q]
                    elif 0 < q < seq:
                        named[q] = digest
            prev = env["hash"]
            events += 1
            expect += 1
        return None

    failed = check(stored)
    if failed is not None:
        return failed
    hseq, hhash = head()
    rounds = 0
    while more is not None and hseq > events and rounds < VERIFY_CATCH_UP_ROUNDS:
        rounds += 1
        before = events
        failed = check(more(events + 1))
        if failed is not None:
            return failed
        if events == before:
            break  # nothing more is stored: the head names events that are missing
        hseq, hhash = head()
    if pending:
        first = min(pending)
        return bad(first, f"event {first} is erased but no log.erased event names it with its hash")
    if hseq > events:
        return VerifyResult(False, events, hseq, hhash, events + 1,
                            f"event {events + 1} is missing (head records seq {hseq})", erased)
    if hseq != events or hhash != prev:
        return VerifyResult(False, events, hseq, hhash, hseq + 1 if hseq < events else max(events, 1),
                            "recorded head does not match the last event", erased)
    return VerifyResult(True, events, hseq, hhash, None, None, erased, unerased_named=named)


class LogBase(abc.ABC):
    """``follow`` and ``verify`` for a backend that provides ``read``, ``get``, ``head``, ``closed`` and
    ``_wait_appended(seconds)`` (returns early when this process appends or the log closes)."""

    _closed: bool

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @abc.abstractmethod
    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        """Envelopes with ``from_seq <= seq <= to_seq`` in order (``raw``: ``(seq, bytes)``)."""

    @abc.abstractmethod
    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the newest event (``(0, ZERO_HASH)`` when empty)."""

    @abc.abstractmethod
    def get(self, seq: int) -> dict[str, Any] | None:
        """The envelope at ``seq``, or None."""

    @abc.abstractmethod
    def _wait_appended(self, seconds: float) -> None:
        """Return after ``seconds``, or earlier when this process appends or the log closes."""

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the event log is closed", hint="open the log again")

    def verify(self) -> VerifyResult:
        """Recompute the whole chain in one streaming pass (constant memory); see :func:`verify_chain`."""
        self._check_open()
        res = verify_chain(self.read(1, raw=True), self.head, lambda seq: self.read(seq, raw=True))
        return res.name_unerased(self.get) if res.unerased_named else res

    def follow(self, from_seq: int = 1, timeout: float | None = None, *,
               poll: float = FOLLOW_POLL_S) -> Iterator[dict[str, Any]]:
        """Yield envelopes from ``from_seq`` on, waiting for new ones as they land.

        Appends of this process wake the follower at once; appends of other processes are
        noticed within ``poll`` seconds (a cheap head check, never a busy loop). Stops after
        ``timeout`` seconds without a new event (never, if ``None``) or when the log closes.
        """
        nxt = max(1, seq_arg(from_seq, "from_seq"))
        idle_since = time.monotonic()
        while not self.closed:
            got = False
            try:
                for env in self.read(nxt):
                    got = True
                    nxt = env["seq"] + 1
                    yield env
            except ClosedError:
                return
            now = time.monotonic()
            if got:
                idle_since = now
                continue
            if timeout is not None and now - idle_since >= timeout:
                return
            self._wait_appended(poll if timeout is None else min(poll, max(0.0, timeout - (now - idle_since))))


def erase_event(seqs_hashes: list[list[Any]], data: dict[str, Any]) -> dict[str, Any]:
    """The input event of an erase: ``log.erased`` with ``data`` and the erased ``[[seq, hash], ...]``."""
    if not isinstance(data, dict):
        raise ValidationError("data", "must be a JSON object")
    if "erased" in data:
        raise ValidationError("data.erased", "is set by the log")
    return {"type": codec.ERASED_TYPE, "session": None, "data": {**data, "erased": seqs_hashes}}


ERASE_ENTRY_BYTES = 90
"""The most bytes one erased event takes in its erase record: ``[seq, "<64 hex>"],``."""


def erase_record_room(data: dict[str, Any]) -> int:
    """How many events one ``log.erased`` record with ``data`` (reason, by, sessions, ...) can
    name within the event size limit (at least one: a record that cannot name one is refused as
    the log refuses it). An erase of more is made of several, the oldest events first."""
    room = codec.MAX_EVENT_BYTES - 1024 - len(codec.encode_plain(data, "data"))
    return max(1, room // ERASE_ENTRY_BYTES)


def erasable(wanted: list[int], envelope_at: Callable[[int], dict[str, Any] | None],
             keep: Callable[[dict[str, Any]], Any] = lambda env: env) -> list[Any]:
    """The envelopes at ``wanted`` an erase replaces: those not erased already, in order, each
    as ``keep`` reduces it (what the erase needs of it: the envelopes of a large session whole
    held gigabytes). :class:`ValidationError` for a seq the log does not hold or an erase record
    (never erased)."""
    out = []
    for q in wanted:
        env = envelope_at(q)
        if env is None:
            raise ValidationError("seqs", f"the log holds no event {q}")
        if codec.is_stub(env):
            continue
        if env.get("type") == codec.ERASED_TYPE:
            raise ValidationError("seqs", f"event {q} is an erase record: it is never erased")
        out.append(keep(env))
    return out


def named_unerased(records: Iterable[dict[str, Any]],
                   envelope_at: Callable[[int], dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The envelopes that the imported ``log.erased`` records among ``records`` name — seq and
    hash — and that the log still holds whole: events it held before the import continued it
    (the records' own import carries stubs). An import or ``log copy`` that brings a record
    replaces them by their stubs as the erase did at the source, so the record never stands
    beside the words it erased (outside audit, helper-74: a mirror refreshed after an erase
    kept them, and ``verify`` counted nothing erased)."""
    named: dict[int, str] = {}
    for env in records:
        if env.get("type") == codec.ERASED_TYPE:
            named.update(erased_pairs(env))
    out = []
    for q in sorted(named):
        held = envelope_at(q)
        if held is not None and held_whole(held, named[q]):
            out.append(held)
    return out


def erased_pairs(record: dict[str, Any]) -> Iterator[tuple[int, str]]:
    """The ``(seq, hash)`` pairs a ``log.erased`` record names (its ``data.erased``); anything
    else in that list is skipped."""
    data = record.get("data")
    listed = data.get("erased") if isinstance(data, dict) else None
    for pair in listed if isinstance(listed, list) else ():
        if isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and isinstance(pair[1], str):
            yield pair[0], pair[1]


def held_whole(env: dict[str, Any], digest: str) -> bool:
    """Whether ``env`` is what an erase record naming ``digest`` at its seq meant to erase and it
    still holds its content: not a stub, not an erase record (never erased), the same hash."""
    return not codec.is_stub(env) and env.get("type") != codec.ERASED_TYPE and env.get("hash") == digest


def check_erase_seqs(seqs: Any) -> list[int]:
    """The seqs of an erase, sorted and distinct; :class:`ValidationError` for anything else."""
    if isinstance(seqs, (str, bytes, dict)) or not hasattr(seqs, "__iter__"):
        raise ValidationError("seqs", "must be a list of seqs")
    out = sorted(set(seqs))
    if any(type(s) is not int or s < 1 for s in out):
        raise ValidationError("seqs", "must be positive integers")
    return out
