"""The event envelope: validation of what callers hand in, canonical bytes, the hash chain.

Canonical bytes are ``orjson.dumps(obj, option=OPT_SORT_KEYS)``. An event's hash is
``sha256(bytes.fromhex(prev) + canonical(event without "hash"))``. The stored value is the
canonical encoding of the whole envelope, hash included, so a stored event re-encodes to
exactly its own bytes — anything else is tampering.

Only plain JSON is accepted (dict with str keys, list, str, int within 64 bits, finite float,
bool, None): nothing is ever pickled, evaluated or coerced from another type on load.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import time
from dataclasses import dataclass
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
_INT64 = (-(2**63), 2**63 - 1)


def canonical(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, compact, UTF-8."""
    return orjson.dumps(obj, option=_SORT)


def decode(raw: bytes | memoryview) -> dict[str, Any]:
    """Decode stored envelope bytes. Raises ``ValueError`` on anything that is not a JSON object."""
    obj = orjson.loads(bytes(raw))
    if not isinstance(obj, dict):
        raise ValueError("stored event is not a JSON object")
    return obj


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
        if not _INT64[0] <= value <= _INT64[1]:
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
            return raw
    except (orjson.JSONEncodeError, TypeError, RecursionError):
        pass
    check_json(data, field)
    raise ValidationError(field, "not plain JSON")


def _depth_ok(value: Any, depth: int = 0) -> bool:
    if depth > MAX_DEPTH:
        return False
    if type(value) is dict:
        return all(_depth_ok(v, depth + 1) for v in value.values() if type(v) in (dict, list))
    if type(value) is list:
        return all(_depth_ok(v, depth + 1) for v in value if type(v) in (dict, list))
    return True


@dataclass(frozen=True, slots=True)
class Prepared:
    """An input event validated and encoded outside the write transaction."""

    type: str
    v: int
    session: str | None
    id: str
    data_bytes: bytes
    caller_id: bool

    def same_content(self, stored: Mapping[str, Any]) -> bool:
        """True when a stored envelope carries this event's type, version, session and data."""
        return (
            stored.get("type") == self.type
            and stored.get("v") == self.v
            and stored.get("session") == self.session
            and canonical(stored.get("data")) == self.data_bytes
        )


def prepare(event: Any, index: int = 0) -> Prepared:
    """Validate one input event ``{"type", "session"?, "data", "id"?, "v"?}`` and encode its data.

    Raises :class:`ValidationError` naming the field (prefixed ``events[i].``).
    """
    p = f"events[{index}]"
    if hasattr(event, "to_input"):
        event = event.to_input()
    if not isinstance(event, dict):
        raise ValidationError(p, "an event must be a JSON object")
    unknown = set(event) - ENVELOPE_INPUT_KEYS
    if unknown:
        raise ValidationError(f"{p}.{sorted(map(str, unknown))[0]}", "unknown envelope key")
    etype = event.get("type")
    if type(etype) is not str or not TYPE_RE.fullmatch(etype) or len(etype) > 128:
        raise ValidationError(f"{p}.type", "must be a dotted lower-case name such as 'message.appended'")
    session = event.get("session")
    if session is not None and (type(session) is not str or not ID_RE.fullmatch(session)):
        raise ValidationError(f"{p}.session", "must be null or 1-128 characters of [A-Za-z0-9_.:@-]")
    eid = event.get("id")
    caller_id = eid is not None
    if caller_id:
        if type(eid) is not str or not ID_RE.fullmatch(eid):
            raise ValidationError(f"{p}.id", "must be 1-128 characters of [A-Za-z0-9_.:@-]")
    else:
        eid = new_id()
    v = event.get("v", 1)
    if type(v) is not int or not 1 <= v <= 1000:
        raise ValidationError(f"{p}.v", "must be an integer version between 1 and 1000")
    if "data" not in event:
        raise ValidationError(f"{p}.data", "is required")
    data = event["data"]
    if type(data) is not dict:
        raise ValidationError(f"{p}.data", "must be a JSON object")
    data_bytes = encode_plain(data, f"{p}.data")
    if len(data_bytes) + 512 > MAX_EVENT_BYTES:
        raise EventTooLargeError(
            f"{p}.data", f"{len(data_bytes)} bytes encoded; an event is limited to {MAX_EVENT_BYTES} bytes"
        )
    return Prepared(etype, v, session, eid, data_bytes, caller_id)


def seal(p: Prepared, seq: int, ts: int, prev: str) -> tuple[bytes, str]:
    """Build the stored bytes of ``p`` at ``seq`` and return ``(stored_bytes, hash)``.

    Assembled from pre-encoded parts in sorted key order, so the data is encoded once per
    append; equal to ``canonical(envelope)`` (checked by property tests).
    """
    dumps = orjson.dumps
    tail = (
        b',"id":' + dumps(p.id)
        + b',"prev":"' + prev.encode()
        + b'","seq":' + str(seq).encode()
        + b',"session":' + dumps(p.session)
        + b',"ts":' + str(ts).encode()
        + b',"type":' + dumps(p.type)
        + b',"v":' + str(p.v).encode()
        + b"}"
    )
    body = b'{"data":' + p.data_bytes + tail
    digest = hashlib.sha256(bytes.fromhex(prev) + body).hexdigest()
    stored = b'{"data":' + p.data_bytes + b',"hash":"' + digest.encode() + b'"' + tail
    return stored, digest


def check_stored(raw: bytes, expect_seq: int, expect_prev: str) -> tuple[dict[str, Any] | None, str | None]:
    """Check one stored event against its position in the chain.

    Returns ``(envelope, None)`` when it is intact, else ``(envelope_or_None, reason)``.
    """
    try:
        env = decode(raw)
    except ValueError as e:
        return None, f"stored bytes are not a JSON object ({e})"
    if env.get("seq") != expect_seq:
        return env, f"event carries seq {env.get('seq')!r}, expected {expect_seq}"
    if env.get("prev") != expect_prev:
        return env, "prev does not match the hash of the previous event"
    claimed = env.get("hash")
    body = dict(env)
    body.pop("hash", None)
    try:
        encoded = canonical(body)
    except orjson.JSONEncodeError as e:
        return env, f"event does not re-encode ({e})"
    try:
        actual = hashlib.sha256(bytes.fromhex(expect_prev) + encoded).hexdigest()
    except ValueError:
        return env, "prev is not a hex sha256"
    if actual != claimed:
        return env, "hash does not match the event's bytes"
    if canonical(env) != bytes(raw):
        return env, "stored bytes are not the canonical encoding of the event"
    return env, None


class _IdState:
    pid = -1
    salt = ""
    n = 0


def new_id(now_ns: int | None = None) -> str:
    """A 32-character, time-sortable unique id: 64-bit ns clock, a per-process counter, and
    a random per-process salt (re-rolled after fork), all hex."""
    st = _IdState
    pid = os.getpid()
    if st.pid != pid:
        st.pid, st.salt, st.n = pid, os.urandom(5).hex(), 0
    st.n = n = (st.n + 1) & 0xFFFFFF
    ns = now_ns if now_ns is not None else time.time_ns()
    return f"{ns:016x}{n:06x}{st.salt}"
