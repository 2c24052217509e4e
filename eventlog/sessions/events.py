"""The session-event catalogue: types, versions, validation, normalization and upcasting.

Pure functions, no I/O. ``docs/EVENTS.md`` is the contract this module implements.

- :func:`validate` checks the ``data`` of one event against the current version of its type
  and returns it *normalized* (surrogates replaced, JSON strings decoded, times as float
  epoch seconds, documented defaults filled in). It raises only :class:`ValidationError`,
  whose ``field`` names the offending field (``"type"``, ``"session"``, ``"data.role"``,
  ``"data.tool_calls[0].id"`` ...).
- :func:`make_event` builds what a writer hands to the log.
- :func:`upcast` brings a stored envelope of an older version to the current version; every
  consumer calls it before folding an event.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, NamedTuple

import orjson

from eventlog.errors import EventTooLargeError, ValidationError
from eventlog.sessions.rules import (
    ID_RE,
    INT64_MAX,
    INT64_MIN,
    MAX_COST,
    MAX_DEPTH,
    MAX_EVENT_BYTES,
    MAX_LIST_ITEMS,
    MAX_PATH,
    MAX_SHORT,
    MAX_TEXT_BYTES,
    MAX_TIME,
    MAX_TITLE,
    TITLE_RANK,
    TOKENS,
    clean_text,
    normalize_title,
)

CURRENT_VERSIONS: dict[str, int] = {
    "session.created": 1,
    "session.ended": 1,
    "session.reopened": 1,
    "session.titled": 1,
    "session.archived": 1,
    "session.unarchived": 1,
    "session.pinned": 1,
    "session.unpinned": 1,
    "session.hidden": 1,
    "session.unhidden": 1,
    "session.meta_updated": 1,
    "session.deleted": 1,
    "message.appended": 2,
    "message.reaction_set": 1,
    "message.reaction_removed": 1,
    "reactions.seen": 1,
    "messages.rewound": 1,
    "usage.recorded": 1,
}

ROLES = frozenset({"system", "user", "assistant", "tool", "session_meta"})
MESSAGE_REFERENCES = frozenset({"message.reaction_set", "message.reaction_removed", "messages.rewound"})
"""Event types that name a message of their own session (``data.message_id``, the message's seq):
writers refuse one whose message is not there (SessionStore, ``eventlog append``)."""

EVENT_TIME_FIELDS = {"session.created": "started_at", "message.appended": "timestamp", "session.ended": "ended_at"}
"""The one field of each type that reads as the event's own time (``ts``) when it is left out:
an import that appends an export's events anew writes the source's time into it, so the
imported session reads as it did at the source."""

Validator = Callable[[Any, str], Any]


# ---------------------------------------------------------------------------------------
# Text and JSON values


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _exact(value: Any) -> Any:
    """A str, int or float subclass's own value as the exact builtin: the checks below then
    see what will be stored, not what a subclass's ``__eq__``, ``__hash__`` or ``__int__``
    make of it (a role that compared equal to every name, a count whose ``__int__`` lied)."""
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return value


def _json_value(value: Any, field: str, depth: int = 1) -> Any:
    """Normalize a JSON value: exact builtin types, clean text, finite floats, int64 ints."""
    value = _exact(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValidationError(field, "integer outside the signed 64-bit range")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(field, "NaN and Infinity are not JSON")
        return float(value)
    if isinstance(value, (dict, list, tuple)):
        if depth > MAX_DEPTH:
            raise ValidationError(field, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValidationError(field, f"object keys must be strings, got {_kind(key)}")
                clean = clean_text(key)
                if clean in out:
                    raise ValidationError(field, f"key {clean!r} repeats once surrogates are replaced")
                out[clean] = _json_value(item, f"{field}.{clean[:64]}", depth + 1)
            return out
        return [_json_value(item, f"{field}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise ValidationError(field, f"{_kind(value)} is not a JSON value")


def _decode_json_string(value: str, field: str) -> Any:
    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(clean_text(value), parse_constant=refuse_constant)
    except (ValueError, RecursionError) as e:
        raise ValidationError(field, f"a string here must hold valid JSON ({str(e)[:80]})") from None


def _structured(*allowed: type) -> Validator:
    names = " or ".join("object" if t is dict else "list" for t in allowed)

    def check(value: Any, field: str) -> Any:
        if isinstance(value, str):
            value = _decode_json_string(value, field)
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, allowed):
            raise ValidationError(field, f"must be a JSON {names}, got {_kind(value)}")
        return _json_value(value, field)

    return check


# ---------------------------------------------------------------------------------------
# Field validators: (value, field) -> normalized value, raising ValidationError(field, ...)


def _text(limit: int = MAX_SHORT, *, nonempty: bool = False) -> Validator:
    def check(value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise ValidationError(field, f"must be a string, got {_kind(value)}")
        text = clean_text(_exact(value))
        if len(text) > limit:
            raise ValidationError(field, f"longer than {limit} characters")
        if nonempty and not text.strip():
            raise ValidationError(field, "must not be empty")
        return text

    return check


def _long_text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {_kind(value)}")
    text = clean_text(value)
    if len(text) > MAX_TEXT_BYTES // 4 and len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise ValidationError(field, "longer than 8 MiB of UTF-8")
    return text


def _content(value: Any, field: str) -> Any:
    if isinstance(value, str):
        return _long_text(value, field)
    if isinstance(value, (list, tuple, dict)):
        out = _json_value(list(value) if isinstance(value, tuple) else value, field)
        if len(orjson.dumps(out)) > MAX_TEXT_BYTES:
            raise ValidationError(field, "longer than 8 MiB once encoded as JSON")
        return out
    raise ValidationError(field, f"must be a string, a JSON list or object, or null, got {_kind(value)}")


def validate_session_id(value: Any, field: str = "session") -> str:
    """Return ``value`` if it is an id of 1-128 characters of ``[A-Za-z0-9_.:@-]``;
    else raise :class:`ValidationError` naming ``field``."""
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {_kind(value)}")
    if not ID_RE.fullmatch(value):
        raise ValidationError(field, "must be 1-128 characters of [A-Za-z0-9_.:@-]")
    return str.__str__(value)


def _external_id(value: Any, field: str) -> str:
    """Routing ids of other systems (chat, user, thread): text, or an int kept as its digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = _exact(value)
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValidationError(field, "integer outside the signed 64-bit range")
        return str(value)
    result: str = _SHORT(value, field)
    return result


def _int_range(low: int) -> Validator:
    def check(value: Any, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(field, f"must be an integer, got {_kind(value)}")
        value = _exact(value)
        if not low <= value <= INT64_MAX:
            raise ValidationError(field, f"must be between {low} and {INT64_MAX}")
        return int(value)

    return check


def _cost(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(field, f"must be a number or null, got {_kind(value)}")
    value = _exact(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(field, "NaN and Infinity are not costs")
    if not 0 <= value <= MAX_COST:
        raise ValidationError(field, f"must be between 0 and {MAX_COST:g}")
    return float(value)


_ISO_TIME_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2})(?::([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]+))?)?)?"
    r"(?:[Zz]|([+-])([0-9]{2})(?::?([0-9]{2}))?)?)?")
"""The ISO-8601 times :func:`parse_time` reads: an extended-format date, optionally a time
(hours, minutes, seconds, a fraction of any length) and a ``Z`` or ``±HH[[:]MM]`` offset."""


def _iso_time(text: str) -> datetime:
    """``text`` (matching :data:`_ISO_TIME_RE`) as an aware datetime (UTC when it names no
    offset); ValueError otherwise. Parsed here rather than by ``datetime.fromisoformat``, whose
    grammar grew in Python 3.11 (fractions of other than 3 or 6 digits, ``+HHMM`` offsets): the
    same string is accepted, or refused, on every Python this package supports."""
    match = _ISO_TIME_RE.fullmatch(text)
    if match is None:
        raise ValueError(text)
    year, month, day, hour, minute, second, fraction, sign, off_hours, off_minutes = match.groups()
    zone = timezone.utc
    if sign is not None:
        if int(off_minutes or 0) >= 60:
            raise ValueError(text)
        offset = timedelta(hours=int(off_hours), minutes=int(off_minutes or 0))
        zone = timezone(-offset if sign == "-" else offset)  # ValueError from 24 hours on
    micro = int((fraction or "0")[:6].ljust(6, "0"))  # beyond microseconds: cut, as 3.11 does
    return datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0), micro,
                    tzinfo=zone)


def parse_time(value: Any, field: str = "timestamp") -> float:
    """Normalize a caller-given time to float epoch seconds in [0, 4.2e9].

    Accepts an int or float (not bool, NaN or infinite) or an ISO-8601 string
    (:data:`_ISO_TIME_RE`; ``Z`` or no offset means UTC). Raises :class:`ValidationError`
    naming ``field`` for anything else.
    """
    if isinstance(value, bool):
        raise ValidationError(field, "must be epoch seconds or an ISO-8601 string, got bool")
    value = _exact(value)
    if isinstance(value, (int, float)):
        seconds = value
    elif isinstance(value, str):
        text = value.strip()
        if len(text) > 64:
            raise ValidationError(field, "not an ISO-8601 time")
        try:
            seconds = _iso_time(text).timestamp()
        except (ValueError, TypeError, OverflowError, OSError):
            raise ValidationError(field, f"not an ISO-8601 time: {clean_text(value)[:64]!r}") from None
    else:
        raise ValidationError(field, f"must be epoch seconds or an ISO-8601 string, got {_kind(value)}")
    if not 0 <= seconds <= MAX_TIME:  # also false for NaN
        raise ValidationError(field, f"must be between 0 and {MAX_TIME:g} epoch seconds")
    return float(seconds)


def _choice(options: frozenset[str] | dict[str, int]) -> Validator:
    def check(value: Any, field: str) -> str:
        value = _exact(value)
        if not isinstance(value, str) or value not in options:
            allowed = "|".join(sorted(options))
            shown = repr(clean_text(value)[:64]) if isinstance(value, str) else _kind(value)
            raise ValidationError(field, f"must be one of {allowed}, got {shown}")
        return str.__str__(value)

    return check


def _title(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {_kind(value)}")
    title = normalize_title(value)
    if not 1 <= len(title) <= MAX_TITLE:
        raise ValidationError(field, f"must be 1-{MAX_TITLE} characters after trimming whitespace")
    return title


def _string_list(value: Any, field: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise ValidationError(field, f"must be a list of strings, got {_kind(value)}")
    if len(value) > MAX_LIST_ITEMS:
        raise ValidationError(field, f"more than {MAX_LIST_ITEMS} items")
    return [_SHORT(item, f"{field}[{i}]") for i, item in enumerate(value)]


_SHORT = _text()
_NAME = _text(nonempty=True)
_PATH_TEXT = _text(MAX_PATH)
_COUNT = _int_range(0)
_SEQ = _int_range(1)
_OBJECT = _structured(dict)
_LIST = _structured(list)
_LIST_OR_OBJECT = _structured(list, dict)
_PROVENANCE = _choice(TITLE_RANK)

# type -> field -> (validator, required)
_SCHEMAS: dict[str, dict[str, tuple[Validator, bool]]] = {
    "session.created": {
        "source": (_SHORT, False),
        "model": (_SHORT, False),
        "model_config": (_OBJECT, False),
        "cwd": (_PATH_TEXT, False),
        "git_repo_root": (_PATH_TEXT, False),
        "git_branch": (_SHORT, False),
        "parent_session_id": (validate_session_id, False),
        "user_id": (_external_id, False),
        "chat_id": (_external_id, False),
        "chat_type": (_SHORT, False),
        "thread_id": (_external_id, False),
        "title": (_title, False),
        "title_source": (_PROVENANCE, False),
        "started_at": (parse_time, False),
    },
    "session.ended": {"reason": (_NAME, True), "ended_at": (parse_time, False)},
    "session.titled": {"title": (_title, True), "source": (_PROVENANCE, False)},
    "session.meta_updated": {
        "model": (_SHORT, False),
        "model_config": (_OBJECT, False),
        "cwd": (_PATH_TEXT, False),
        "git_repo_root": (_PATH_TEXT, False),
        "git_branch": (_SHORT, False),
        "tool_names": (_string_list, False),
        "source": (_SHORT, False),
    },
    "message.appended": {
        "role": (_choice(ROLES), True),
        "content": (_content, False),
        "tool_calls": (_LIST, False),
        "tool_name": (_SHORT, False),
        "tool_call_id": (_SHORT, False),
        "reasoning": (_long_text, False),
        "reasoning_details": (_LIST_OR_OBJECT, False),
        "token_count": (_COUNT, False),
        "finish_reason": (_SHORT, False),
        "display_kind": (_SHORT, False),
        "display_metadata": (_OBJECT, False),
        "timestamp": (parse_time, False),
    },
    "message.reaction_set": {
        "message_id": (_SEQ, True),
        "author": (_NAME, True),
        "emoji": (_NAME, True),
    },
    "message.reaction_removed": {"message_id": (_SEQ, True), "author": (_NAME, True)},
    "reactions.seen": {"up_to": (_COUNT, True)},
    "messages.rewound": {"message_id": (_SEQ, True)},
    "usage.recorded": {
        "model": (_SHORT, False),
        "provider": (_SHORT, False),
        "task": (_SHORT, False),
        **{name: (_COUNT, False) for name in TOKENS},
        "estimated_cost_usd": (_cost, False),
        "actual_cost_usd": (_cost, False),
        "message_id": (_SEQ, False),
    },
}
for _flag_type in (
    "session.reopened", "session.archived", "session.unarchived", "session.pinned",
    "session.unpinned", "session.hidden", "session.unhidden", "session.deleted",
):
    _SCHEMAS[_flag_type] = {}
assert set(_SCHEMAS) == set(CURRENT_VERSIONS)


def validate(type: str, data: Any, session: Any) -> dict[str, Any]:
    """Check one event's ``data`` against the current version of ``type``; return it normalized.

    ``data=None`` means ``{}``. Optional fields given as ``None`` are kept as ``None``
    (meaning unknown, or "clear" in ``session.meta_updated``) except where a default is
    documented: ``session.titled.source`` and ``session.created.title_source`` (when a title is
    given) default to ``"user"``, and ``usage.recorded`` token counts to 0. Fields that default
    to the event time are left out when not given.

    Raises :class:`ValidationError` (and nothing else) with ``field`` naming what was refused.
    """
    if type is None:
        raise ValidationError("type", "is required")
    if not isinstance(type, str) or type not in _SCHEMAS:
        shown = clean_text(type)[:64] if isinstance(type, str) else _kind(type)
        raise ValidationError("type", f"unknown event type {shown!r}")
    sid = validate_session_id(session, "session")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValidationError("data", f"must be a JSON object, got {_kind(data)}")
    schema = _SCHEMAS[type]
    for key in data:
        if not isinstance(key, str) or key not in schema:
            shown = clean_text(key)[:64] if isinstance(key, str) else f"<{_kind(key)} key>"
            raise ValidationError(f"data.{shown}", f"not a field of {type}")
    out: dict[str, Any] = {}
    for name, (check, required) in schema.items():
        field = f"data.{name}"
        if name not in data:
            if required:
                raise ValidationError(field, "is required")
            continue
        value = data[name]
        if value is None:
            if required:
                raise ValidationError(field, "is required and must not be null")
            out[name] = None
        else:
            out[name] = check(value, field)
    _complete(type, sid, out)
    return out


def _complete(type: str, session: str, out: dict[str, Any]) -> None:
    """Cross-field rules and documented defaults."""
    if type == "session.created":
        if out.get("parent_session_id") == session:
            raise ValidationError("data.parent_session_id", "a session cannot be its own parent")
        if out.get("title") is None:
            out.pop("title_source", None)
        elif out.get("title_source") is None:
            out["title_source"] = "user"
    elif type == "session.titled":
        if out.get("source") is None:
            out["source"] = "user"
    elif type == "session.meta_updated":
        if not out:
            raise ValidationError("data", "session.meta_updated needs at least one field")
    elif type == "usage.recorded":
        for name in TOKENS:
            if out.get(name) is None:
                out[name] = 0


def make_event(type: str, session: str, data: Any, id: str | None = None) -> dict[str, Any]:
    """Build a validated event for :meth:`EventLog.append`.

    Returns ``{"type", "session", "data", "v"}`` plus ``"id"`` when given. Raises
    :class:`ValidationError` (field ``"id"`` for a malformed id) or
    :class:`EventTooLargeError` when the encoded event would exceed 16 MiB.
    """
    normalized = validate(type, data, session)
    event: dict[str, Any] = {
        "type": type,
        "session": str.__str__(session),
        "data": normalized,
        "v": CURRENT_VERSIONS[type],
    }
    if id is not None:
        event["id"] = validate_session_id(id, "id")
    # 512 bytes of headroom for the seq, ts, prev and hash the log adds.
    if len(orjson.dumps(event)) + 512 > MAX_EVENT_BYTES:
        raise EventTooLargeError("data", "the encoded event exceeds 16 MiB")
    return event


# ---------------------------------------------------------------------------------------
# Read models: one handler per event type, checked against the catalogue


class Handler(NamedTuple):
    """How a read model applies one event type: ``apply`` reads ``data`` of catalogue ``version``
    (what :func:`upcast` hands it)."""

    version: int
    apply: Callable[..., None]


def check_handlers(owner: str, handlers: Mapping[str, Handler]) -> None:
    """Refuse a dispatch table that does not cover the catalogue exactly: every type of
    :data:`CURRENT_VERSIONS` at its current version, nothing else.

    Every read model calls this when its module is imported, so an event type added to the
    catalogue (or a version bump) that one read model does not handle fails at import, not in
    production. Raises :class:`RuntimeError` naming ``owner`` and each mismatch.
    """
    problems = [f"no handler for {t} (v{v})" for t, v in CURRENT_VERSIONS.items() if t not in handlers]
    problems += [f"a handler for {t!r}, which the catalogue does not have" for t in handlers if t not in CURRENT_VERSIONS]
    problems += [f"the handler for {t} reads v{h.version}, the catalogue is at v{CURRENT_VERSIONS[t]}"
                 for t, h in handlers.items() if t in CURRENT_VERSIONS and h.version != CURRENT_VERSIONS[t]]
    if problems:
        raise RuntimeError(f"{owner} does not match the event catalogue: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------
# Upcasting

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def register_upcaster(type: str, from_v: int) -> Callable[[Upcaster], Upcaster]:
    """Decorator: ``fn(data) -> data`` turns ``type``'s data from version ``from_v`` into ``from_v + 1``.

    ``fn`` receives a copy it may change, and must not raise on odd stored data.
    Registering the same ``(type, from_v)`` again replaces the previous function.
    """

    def register(fn: Upcaster) -> Upcaster:
        _UPCASTERS[(type, from_v)] = fn
        return fn

    return register


def upcast(envelope: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``envelope`` whose ``data`` and ``v`` are in the current version.

    Steps through the registered upcasters one version at a time. A missing ``v`` counts as 1.
    Unknown types, versions newer than this code knows, a non-integer ``v``, non-object data
    and a gap in the upcaster chain leave the rest unchanged (consumers ignore what they cannot
    read). The returned envelope and its ``data`` dict are fresh; nested values may be shared.
    """
    out = dict(envelope)
    data = out.get("data")
    if isinstance(data, dict):
        data = dict(data)
        out["data"] = data
    type_ = out.get("type")
    current = CURRENT_VERSIONS.get(type_) if isinstance(type_, str) else None
    version = out.get("v", 1)
    if current is None or isinstance(version, bool) or not isinstance(version, int):
        return out
    while version < current and isinstance(data, dict):
        step = _UPCASTERS.get((type_, version))  # type: ignore[arg-type]
        if step is None:
            break
        data = step(data)
        version += 1
    out["data"] = data
    out["v"] = version
    return out


@register_upcaster("message.appended", 1)
def _message_appended_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 ``text``/``tool_calls_json`` become v2 ``content``/``tool_calls`` (a list, else null)."""
    text = data.pop("text", None)
    raw_calls = data.pop("tool_calls_json", None)
    calls = None
    if isinstance(raw_calls, str):
        try:
            decoded = _LIST(raw_calls, "data.tool_calls_json")
        except ValidationError:
            decoded = None
        if isinstance(decoded, list):
            calls = decoded
    data["content"] = text
    data["tool_calls"] = calls
    return data


# ---------------------------------------------------------------------------------------
# Titles


_NUMBERED_RE = re.compile(r"(.*\S) #([0-9]+)")


def next_title(base: str, taken: set[str]) -> str:
    """Return a title derived from ``base`` that is not in ``taken``.

    An existing `` #N`` suffix of ``base`` is stripped first. ``base`` itself is returned when
    free; otherwise ``"base #N"`` with N one more than the highest number already taken for
    that base (at least 2), shortened to fit 200 characters. Raises :class:`ValidationError`
    (field ``"title"``) when ``base`` is empty or not a string.
    """
    if not isinstance(base, str):
        raise ValidationError("title", f"must be a string, not {type(base).__name__}")
    title = normalize_title(base)
    numbered = _NUMBERED_RE.fullmatch(title)
    if numbered:
        title = numbered.group(1)
    if not title:
        raise ValidationError("title", "must not be empty")
    title = title[:MAX_TITLE].rstrip()
    if title not in taken:
        return title
    pattern = re.compile(re.escape(title) + r" #([0-9]+)")
    numbers = [int(m.group(1)) for t in taken if isinstance(t, str) and (m := pattern.fullmatch(t))]
    n = max(numbers, default=1) + 1
    while True:
        suffix = f" #{n}"
        candidate = title[: MAX_TITLE - len(suffix)].rstrip() + suffix
        if candidate not in taken:
            return candidate
        n += 1
