"""The event envelope: validation of what callers hand in, canonical bytes, the hash chain.

Canonical bytes are ``orjson.dumps(obj, option=OPT_SORT_KEYS)``. An event's hash is
``sha256(bytes.fromhex(prev) + canonical(event without "hash"))``. The stored value is the
canonical encoding of the whole envelope, hash included, so a stored event re-encodes to
exactly its own bytes — anything else is tampering — with one allowance: orjson has spelled a
float's positive exponent two ways (``1e30`` before 3.11, ``1e+30`` since), so an event keeps the
spelling it was sealed with and is read as canonical in either (:func:`same_canonical`).

Only plain JSON is accepted (dict with str keys, list, str, int within 64 bits, finite float,
bool, None): nothing is ever pickled, evaluated or coerced from another type on load.
"""
from __future__ import annotations

import math
import os
import re
import time
from typing import Any, Mapping

import orjson

from eventlog.errors import EventTooLargeError, ValidationError

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Upper bound of one encoded event (envelope included)."""

MAX_DEPTH = 64
ZERO_HASH = "0" * 64

_SORT = orjson.OPT_SORT_KEYS
TYPE_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
ID_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
ENVELOPE_INPUT_KEYS = frozenset({"type", "session", "data", "id", "v"})
RESERVED_PREFIX = "log."
ERASED_TYPE = "log.erased"
"""The log's own audit event of an erase: its data lists ``erased`` as ``[[seq, hash], ...]``."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The integers JSON values may hold (SQLite's and most readers' limit)."""


def _sha256(data: bytes) -> Any:
    """hashlib.sha256, imported on first use: loading OpenSSL's hashlib costs a read-only
    one-shot (which never hashes) several milliseconds."""
    import hashlib

    return hashlib.sha256(data)


def canonical(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, compact, UTF-8."""
    return orjson.dumps(obj, option=_SORT)


_EXPONENT_HINT = re.compile(rb"[0-9]e\+?[0-9]")
_EXPONENT_OR_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"|(?<=[0-9])e\+?(?=[0-9])', re.S)
"""A JSON string (skipped whole) or a number's positive exponent marker (``e`` or ``e+``)."""


def _toggle(m: re.Match[bytes]) -> bytes:
    found = m.group(0)
    if found[:1] == b'"':
        return found
    return b"e" if found == b"e+" else b"e+"


def respelled(encoded: bytes) -> bytes | None:
    """Canonical bytes ``encoded`` with every float's positive exponent spelled the other way
    orjson has spelled it (``1e30`` / ``1e+30``), or None when it holds no such number. Text
    inside strings is never touched. One orjson writes one spelling, so an event sealed by any
    version is ``canonical(event)`` or this."""
    if _EXPONENT_HINT.search(encoded) is None:
        return None
    other = _EXPONENT_OR_STRING.sub(_toggle, encoded)
    return None if other == encoded else other


def same_canonical(encoded: bytes, raw: bytes | memoryview) -> bool:
    """True when stored bytes ``raw`` are ``encoded`` (this orjson's canonical bytes of what they
    decode to) in either exponent spelling: a log written under an orjson before 3.11 stays
    intact under a later one, and the other way round."""
    raw = bytes(raw)
    return encoded == raw or (len(encoded) != len(raw) and respelled(encoded) == raw)


def hash_without(raw: bytes, claimed: str, prev: str) -> str | None:
    """The hash of stored envelope bytes ``raw`` with its ``"hash"`` field left out — the body
    exactly as it was sealed, whatever the spelling — or None when ``raw`` has no such field.
    Raises ``ValueError`` when ``prev`` is not hex. Canonical bytes sort ``hash`` right after
    ``data``: the field is the last of its form."""
    token = b',"hash":"' + claimed.encode() + b'"'
    at = raw.rfind(token)
    if at >= 0:
        body = raw[:at] + raw[at + len(token):]
    elif raw.startswith(b'{' + token[1:] + b","):  # no field sorts before it (no data)
        body = b"{" + raw[len(token) + 1:]
    elif raw == b"{" + token[1:] + b"}":
        body = b"{}"
    else:
        return None
    digest: str = _sha256(bytes.fromhex(prev) + body).hexdigest()
    return digest


def sealed_bytes(env: dict[str, Any]) -> bytes:
    """The canonical bytes of a sealed envelope in the exponent spelling its hash covers (the
    bytes its log stores and an export must carry), or ``canonical(env)`` when neither does."""
    encoded = canonical(env)
    other = respelled(encoded)
    claimed, prev = env.get("hash"), env.get("prev")
    if other is None or not isinstance(claimed, str) or not isinstance(prev, str):
        return encoded
    try:
        if hash_without(encoded, claimed, prev) != claimed and hash_without(other, claimed, prev) == claimed:
            return other
    except ValueError:
        pass
    return encoded


def decode(raw: bytes | memoryview) -> dict[str, Any]:
    """Decode stored envelope bytes. Raises ``ValueError`` on anything that is not a JSON object."""
    obj = orjson.loads(bytes(raw))
    if not isinstance(obj, dict):
        raise ValueError("stored event is not a JSON object")
    return obj


_LONG_INT = re.compile(rb"(?<![0-9.eE+-])-?[0-9]{19,}(?![0-9.eE])")
"""An integer literal of 19 digits or more: the only ones that may fall outside 64 bits."""


class _Wide(int):
    """An integer literal outside 64 bits, marked while :func:`wide_int` parses."""


def wide_int(raw: bytes) -> str | None:
    """Where JSON text ``raw`` holds an integer literal outside the 64-bit range (the path of its
    field, e.g. ``data.tokens`` or ``data.items[2]``), or None. orjson reads such a literal as a
    float (``18446744073709551616`` becomes ``1.8446744073709552e19``): input text is checked
    here first, so a number is refused instead of stored changed. Only text with a long run of
    digits is parsed a second time (by the standard library, which keeps big integers)."""
    if not _LONG_INT.search(raw):
        return None
    import json

    def number(text: str) -> int:
        value = int(text)
        return value if INT64_MIN <= value <= INT64_MAX else _Wide(value)

    try:
        obj = json.loads(raw, parse_int=number)
    except (ValueError, RecursionError):
        return None  # orjson's own verdict on the text stands

    def find(value: Any, path: str) -> str | None:
        if isinstance(value, _Wide):
            return path or "value"
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            where = find(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
            if where is not None:
                return where
        return None

    return find(obj, "")


def refuse_wide_ints(raw: bytes, where: str) -> None:
    """:class:`ValidationError` naming the field (``line 3.data.n``) when JSON text ``raw`` holds
    an integer literal outside 64 bits (see :func:`wide_int`)."""
    field = wide_int(raw)
    if field is not None:
        raise ValidationError(f"{where}.{field}", "is an integer outside the 64-bit range",
                              hint="integers must lie in -2**63 .. 2**63-1 (give a larger number as a string)")


def check_json(value: Any, field: str, depth: int = 0) -> None:
    """Refuse anything that is not plain, finite, surrogate-free JSON. Names the field."""
    if depth > MAX_DEPTH:
        raise ValidationError(field, f"nested deeper than {MAX_DEPTH} levels")
    if value is None or value is True or value is False:
        return
    t = type(value)
    if t is str:
        _check_text(value, field)
    elif t is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValidationError(field, "integer outside the signed 64-bit range")
    elif t is float:
        if not math.isfinite(value):
            raise ValidationError(field, "NaN and Infinity are not JSON")
    elif t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise ValidationError(field, f"object key {k!r} is not a string")
            _check_text(k, field)
            check_json(v, f"{field}.{k}", depth + 1)
    elif t is list:
        for i, v in enumerate(value):
            check_json(v, f"{field}[{i}]", depth + 1)
    else:
        raise ValidationError(field, f"{t.__name__} is not a JSON value")


def _check_text(s: str, field: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, "text contains a lone surrogate") from None


def encode_plain(data: Any, field: str) -> bytes:
    """Canonical bytes of ``data`` if it is plain JSON; else :class:`ValidationError` naming the field.

    Fast path: orjson encodes (refusing surrogates, bytes, big ints, non-str keys) and the
    decoded copy must equal the input (which refuses NaN, which orjson writes as null, and
    types orjson would convert such as datetimes or tuples). Only a failure pays for the
    walk that names the offending field.
    """
    try:
        raw = canonical(data)
        if orjson.loads(raw) == data and _depth_ok(data):
            if _LONG_DIGITS.search(raw) is not None:  # orjson writes and reads back 64-bit unsigned ints
                _check_ints(data, field)
            return raw
    except (orjson.JSONEncodeError, TypeError, RecursionError):
        pass
    check_json(data, field)
    raise ValidationError(field, "not plain JSON")


_LONG_DIGITS = re.compile(rb"[0-9]{19}")
"""19 digits in a row: the shortest run that can spell an int outside the signed 64-bit range
(2**63 has 19). Rare in real data, so only then are the ints walked."""


def _check_ints(value: Any, field: str) -> None:
    """Refuse an int outside the signed 64-bit range anywhere in ``value`` (whose nesting is
    known to be within bounds), naming its field: every reader of the log, an import of its
    export among them, holds ints to that range."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_ints(v, f"{field}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_ints(v, f"{field}[{i}]")
    elif isinstance(value, int) and not INT64_MIN <= int.__int__(value) <= INT64_MAX:
        raise ValidationError(field, "integer outside the signed 64-bit range")


def _depth_ok(value: Any, depth: int = 0) -> bool:
    """No container nested deeper than MAX_DEPTH (flat objects cost one pass over their values)."""
    if depth > MAX_DEPTH:
        return False
    for v in (value.values() if type(value) is dict else value):
        t = type(v)
        if (t is dict or t is list) and not _depth_ok(v, depth + 1):
            return False
    return True


class Prepared:
    """An input event validated and encoded outside the write transaction.

    It also carries the constant parts of its stored bytes, so :func:`seal` (inside the write
    transaction) only splices in seq, ts and prev and hashes.
    """

    __slots__ = ("type", "v", "session", "id", "data_bytes", "caller_id", "_id_part", "_mid_part", "_tail_part")

    def __init__(self, type: str, v: int, session: str | None, id: str, data_bytes: bytes, caller_id: bool) -> None:
        self.type = type
        self.v = v
        self.session = session
        self.id = id
        self.data_bytes = data_bytes
        self.caller_id = caller_id
        dumps = orjson.dumps
        # Stored key order (sorted): data, hash, id, prev, seq, session, ts, type, v.
        self._id_part = b',"id":' + dumps(id) + b',"prev":"'
        self._mid_part = b',"session":' + dumps(session) + b',"ts":'
        self._tail_part = b',"type":' + dumps(type) + b',"v":' + str(v).encode() + b"}"

    def __repr__(self) -> str:
        return (f"Prepared(type={self.type!r}, v={self.v}, session={self.session!r}, id={self.id!r}, "
                f"data_bytes=<{len(self.data_bytes)} bytes>, caller_id={self.caller_id})")

    def with_id(self, eid: str) -> Prepared:
        """This event under another id (one of :func:`derived_id`'s: no escaping needed)."""
        other = Prepared.__new__(Prepared)
        other.type, other.v, other.session, other.data_bytes = self.type, self.v, self.session, self.data_bytes
        other.id, other.caller_id = eid, self.caller_id
        other._id_part = b',"id":"' + eid.encode() + b'","prev":"'
        other._mid_part, other._tail_part = self._mid_part, self._tail_part
        return other

    def same_content(self, stored: Mapping[str, Any]) -> bool:
        """True when a stored envelope carries this event's type, version, session and data."""
        return (
            stored.get("type") == self.type
            and stored.get("v") == self.v
            and stored.get("session") == self.session
            and canonical(stored.get("data")) == self.data_bytes
        )


_TYPES_SEEN: set[str] = set()
"""Event types that already passed TYPE_RE (bounded): the common case skips the regex."""


def prepare(event: Any, index: int = 0, *, log_type: bool = False) -> Prepared:
    """Validate one input event ``{"type", "session"?, "data", "id"?, "v"?}`` and encode its data.

    Raises :class:`ValidationError` naming the field (prefixed ``events[i].``). The ``log.``
    types are the log's own (``log_type=True``: the log appending one of them itself).
    """
    if type(event) is not dict:
        if hasattr(event, "to_input"):
            event = event.to_input()
        if not isinstance(event, dict):
            raise ValidationError(f"events[{index}]", "an event must be a JSON object")
    if not event.keys() <= ENVELOPE_INPUT_KEYS:
        unknown = set(event) - ENVELOPE_INPUT_KEYS
        raise ValidationError(f"events[{index}].{sorted(map(str, unknown))[0]}", "unknown envelope key")
    etype = event.get("type")
    if type(etype) is not str or etype not in _TYPES_SEEN:  # exact str first: a list is unhashable
        if type(etype) is not str or not TYPE_RE.fullmatch(etype) or len(etype) > 128:
            raise ValidationError(f"events[{index}].type", "must be a dotted lower-case name such as 'message.appended'")
        if len(_TYPES_SEEN) < 4096:
            _TYPES_SEEN.add(etype)
    if etype[:4] == RESERVED_PREFIX and not log_type:
        raise ValidationError(f"events[{index}].type", f"{etype!r}: the 'log.' types are the log's own",
                              hint="erase content with Log.erase or SessionStore.erase_session")
    session = event.get("session")
    if session is not None and (type(session) is not str or not ID_RE.fullmatch(session)):
        raise ValidationError(f"events[{index}].session", "must be null or 1-128 characters of [A-Za-z0-9_.:@-]")
    eid = event.get("id")
    caller_id = eid is not None
    if caller_id:
        if type(eid) is not str or not ID_RE.fullmatch(eid):
            raise ValidationError(f"events[{index}].id", "must be 1-128 characters of [A-Za-z0-9_.:@-]")
    else:
        eid = new_id()
    v = event.get("v", 1)
    if type(v) is not int or not 1 <= v <= 1000:
        raise ValidationError(f"events[{index}].v", "must be an integer version between 1 and 1000")
    data = event.get("data", _MISSING)
    if type(data) is not dict:
        if data is _MISSING:
            raise ValidationError(f"events[{index}].data", "is required")
        raise ValidationError(f"events[{index}].data", "must be a JSON object")
    data_bytes = encode_plain(data, f"events[{index}].data")
    if len(data_bytes) + 512 > MAX_EVENT_BYTES:
        raise EventTooLargeError(
            f"events[{index}].data", f"{len(data_bytes)} bytes encoded; an event is limited to {MAX_EVENT_BYTES} bytes"
        )
    return Prepared(etype, v, session, eid, data_bytes, caller_id)


_MISSING: Any = object()


def seal(p: Prepared, seq: int, ts: int, prev: str) -> tuple[bytes, str]:
    """Build the stored bytes of ``p`` at ``seq`` and return ``(stored_bytes, hash)``.

    Joined from the parts :class:`Prepared` encoded once, in sorted key order; equal to
    ``canonical(envelope)`` (checked by property tests). The data bytes are hashed in place,
    not copied into a body first.
    """
    tail = b"".join((p._id_part, prev.encode(), b'","seq":', str(seq).encode(), p._mid_part, str(ts).encode(),
                     p._tail_part))
    h = _sha256(bytes.fromhex(prev))
    h.update(b'{"data":')
    h.update(p.data_bytes)
    h.update(tail)
    digest = h.hexdigest()
    return b"".join((b'{"data":', p.data_bytes, b',"hash":"', digest.encode(), b'"', tail)), digest


def stub(env: dict[str, Any]) -> dict[str, Any]:
    """The erased form of an envelope: every field but ``data``, and ``"erased": true``. Its
    hash (the event's, as appended) can no longer be recomputed: :func:`check_stored` accepts it
    provisionally and the chain check requires a later ``log.erased`` event to name it."""
    out = {k: v for k, v in env.items() if k != "data"}
    out["erased"] = True
    return out


def is_stub(env: dict[str, Any]) -> bool:
    return env.get("erased") is True and "data" not in env


def sealed_problem(env: dict[str, Any]) -> str | None:
    """Why an imported event's envelope cannot be indexed or read as an event, or None.

    A sealed event is restored as it is (its bytes carry its hash), so its envelope is not held
    to what ``prepare`` accepts: an extra key, an odd ts or version keep their bytes. But its
    type, session and id are what every reader and the log's own indexes look up by, so they
    must be what an append can write: a type that is text, a session that is null or a stream
    id, an id of the id form; and a live event's data is an object."""
    etype, session, eid = env.get("type"), env.get("session"), env.get("id")
    if type(etype) is not str or not etype:
        return f"its type {etype!r} is not a name"
    if session is not None and (type(session) is not str or not ID_RE.fullmatch(session)):
        return "its session is not null or 1-128 characters of [A-Za-z0-9_.:@-]"
    if type(eid) is not str or not ID_RE.fullmatch(eid):
        return "its id is not 1-128 characters of [A-Za-z0-9_.:@-]"
    if not is_stub(env) and type(env.get("data")) is not dict:
        return "its data is not a JSON object"
    return None


def decode_in_place(raw: bytes, expect_seq: int, expect_prev: str) -> tuple[dict[str, Any] | None, str | None]:
    """The envelope of stored bytes ``raw`` and whether it sits where it is read: its seq is
    ``expect_seq`` and its ``prev`` is ``expect_prev`` (the first checks of every chain check)."""
    try:
        env = decode(raw)
    except ValueError as e:
        return None, f"stored bytes are not a JSON object ({e})"
    if env.get("seq") != expect_seq:
        return env, f"event carries seq {env.get('seq')!r}, expected {expect_seq}"
    if env.get("prev") != expect_prev:
        return env, "prev does not match the hash of the previous event"
    return env, None


def check_stored(raw: bytes, expect_seq: int, expect_prev: str) -> tuple[dict[str, Any] | None, str | None]:
    """Check one stored event against its position in the chain.

    Returns ``(envelope, None)`` when it is intact, else ``(envelope_or_None, reason)``. An
    erased event (:func:`stub`) is intact here when its place in the chain and its bytes are;
    whether an erase authorised it is :func:`eventlog.log.base.verify_chain`'s check.
    """
    env, reason = decode_in_place(raw, expect_seq, expect_prev)
    if env is None or reason is not None:
        return env, reason
    if is_stub(env):
        if not isinstance(env.get("hash"), str) or canonical(env) != bytes(raw):
            return env, "erased event is not in its canonical form"
        return env, None
    claimed = env.get("hash")
    try:
        as_stored = same_canonical(canonical(env), raw)
        # the bytes the hash is checked on: as stored when they are canonical, else the event's
        # canonical form (then a change of content is named as such, a reformatting as not canonical)
        form = bytes(raw) if as_stored else sealed_bytes(env)
    except orjson.JSONEncodeError as e:
        return env, f"event does not re-encode ({e})"
    try:
        actual = hash_without(form, claimed, expect_prev) if isinstance(claimed, str) else None
    except ValueError:
        return env, "prev is not a hex sha256"
    if actual is None or actual != claimed:
        return env, "hash does not match the event's bytes"
    if not as_stored:
        return env, "stored bytes are not the canonical encoding of the event"
    return env, None


class _IdState:
    salt = os.urandom(5).hex()
    n = 0


def _reroll_id_salt() -> None:
    _IdState.salt, _IdState.n = os.urandom(5).hex(), 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reroll_id_salt)


DERIVED_SEQ_LIMIT = 1 << 40
"""Seqs an id of the derived form can name. :func:`new_id`'s ids carry a counter of at least 1
above 40 random bits where a derived id has its seq, so they read as seqs beyond this limit."""
HEX32 = re.compile(r"[0-9a-f]{32}")
"""The form of generated ids (both kinds); format 2 stores such an id in 16 bytes."""


def derived_id(ts: int, seq: int) -> str:
    """The id a log may give an event appended without one: its ts and its seq, 16 hex digits
    each (32 lower-case hex digits, like :func:`new_id`'s, time-sortable too). A log that knows
    the form finds such an event by its seq (:func:`derived_seq`) and needs no id index row for it."""
    return f"{ts:016x}{seq:016x}"


def derived_seq(eid: str) -> int:
    """The seq an id of :func:`derived_id`'s form names, else 0. Only a candidate: the event at
    that seq carries the id or it does not (a caller may choose any id, this form included)."""
    if len(eid) != 32 or not HEX32.fullmatch(eid):
        return 0
    seq = int(eid[16:], 16)
    return seq if seq < DERIVED_SEQ_LIMIT else 0


def new_id(now_ns: int | None = None) -> str:
    """A 32-character, time-sortable unique id: 64-bit ns clock, a per-process counter, and
    a random per-process salt (re-rolled in a forked child), all hex."""
    st = _IdState
    st.n = n = (st.n + 1) & 0xFFFFFF
    ns = now_ns if now_ns is not None else time.time_ns()
    return f"{ns:016x}{n:06x}{st.salt}"
