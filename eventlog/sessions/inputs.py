"""Events that arrive as JSON from outside (``eventlog append``, an import of plain events):
checked as :class:`~eventlog.sessions.store.SessionStore` checks what it appends, before
anything is appended. Judged from the log alone: a writer never brings the projections up to
date (the next reader does)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from eventlog.errors import ValidationError
from eventlog.sessions.events import CURRENT_VERSIONS, MESSAGE_REFERENCES, make_event

if TYPE_CHECKING:
    from eventlog.log import Log

INPUT_KEYS = frozenset({"type", "session", "data", "id"})


class _DuplicateKey(Exception):
    pass


def refuse_duplicate_keys(line: str | bytes, where: str) -> None:
    """JSON parsers keep the last of two equal keys (``{"type": "a", "type": "b"}`` is "b"): an
    input event with a repeated key at any depth is refused instead of read either way."""
    import json

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
        return {}

    try:
        json.loads(line, object_pairs_hook=pairs)
    except _DuplicateKey as e:
        raise ValidationError(where, f"the key {e.args[0]!r} appears twice in one JSON object",
                              hint="give each key once") from None
    except (ValueError, RecursionError):
        pass  # orjson already accepted the line; its nesting is judged by the event's own checks


def with_lone_surrogates(line: str | bytes, error: Exception) -> Any:
    """A line orjson refuses only for a lone surrogate escape (``"\\ud800"``, valid JSON text)
    is read by the standard library instead; its text is then validated like any other, which
    stores such a code point as U+FFFD (docs/EVENTS.md). None: the line stays refused."""
    if "surrogate" not in str(error):
        return None
    import json
    import re

    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if re.search("[\ud800-\udfff]", line):  # undecodable input bytes (surrogateescape), not an escape
        return None

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(line, parse_constant=refuse)
    except (ValueError, RecursionError):
        return None


def prepare_input(obj: Any, where: str) -> dict[str, Any]:
    """One input event ``{"type", "session"?, "data", "id"?}`` validated and normalised against
    the catalogue; errors name ``where`` and the field (``line 3.data.role``)."""
    if not isinstance(obj, dict):
        raise ValidationError(where, "an event must be a JSON object")
    unknown = sorted(set(obj) - INPUT_KEYS)
    if unknown:
        raise ValidationError(f"{where}.{unknown[0]}", "unknown envelope key")
    etype = obj.get("type")
    if etype is None:
        raise ValidationError(f"{where}.type", "is required", hint="see docs/EVENTS.md for the catalogue")
    if type(etype) is not str or etype not in CURRENT_VERSIONS:  # str first: a list or dict is unhashable
        raise ValidationError(f"{where}.type", f"unknown event type {etype!r}",
                              hint="see docs/EVENTS.md for the catalogue")
    try:
        return make_event(etype, obj.get("session"), obj.get("data"), id=obj.get("id"))  # type: ignore[arg-type]
    except ValidationError as e:
        raise ValidationError(f"{where}.{e.field}", e.problem, hint=e.hint) from None


def stream_life(log: Log, session_id: str) -> tuple[bool, str | None]:
    """What a session's own stream in the log says: whether it was created and neither deleted
    nor erased (its ancestors are the caller's to follow), and its parent's id."""
    created = gone = False
    parent = None
    for env in log.read_session(session_id):
        if env.get("erased"):  # an erase takes a whole stream: gone for good
            gone = True
        elif env.get("type") == "session.created":
            created = True
            data = env.get("data")
            parent = data.get("parent_session_id") if isinstance(data, dict) else None
        elif env.get("type") == "session.deleted":
            gone = True
    return created and not gone, parent if isinstance(parent, str) else None


def check_sessions(log: Log, wheres: Iterable[str], batch: Iterable[dict[str, Any]], *,
                   references: bool = True) -> None:
    """Refuse, before anything is appended, what SessionStore refuses about sessions: an event
    of a session that does not exist (never created, or deleted — its own stream or an
    ancestor's), a ``session.created`` whose id was used before or whose parent does not exist,
    a reaction or rewind naming what is not a message of its session. Earlier events of the
    batch count. An event whose ``id`` is already in the log is left to the log (an idempotent
    replay, or refused). The i-th of ``wheres`` names event i in errors (``line 3``); both are
    read once, in step, so an import can give them lazily. ``references=False``
    leaves the messages that reactions and rewinds name to the caller (an import renumbers them)."""
    empty = log.head()[0] == 0  # an empty log holds no session yet
    known: dict[str, bool] = {}
    own: dict[str, bool] = {}  # of the sessions looked at: whether their own stream is live
    parents: dict[str, str | None] = {}  # of the sessions looked at: their parent

    def live_in_log(s: str, depth: int = 0) -> bool:
        if empty:
            return False
        if s not in known:
            alive, parents[s] = stream_life(log, s)
            own[s] = alive
            known[s] = alive and (parents[s] is None or depth > 64 or live_in_log(parents[s], depth + 1))  # type: ignore[arg-type]
        return known[s]

    created: set[str] = set()
    deleted: set[str] = set()

    def live(s: str) -> bool:
        if s in deleted or not (s in created or live_in_log(s)):
            return False
        up = parents.get(s)
        for _ in range(65):  # an ancestor deleted by an earlier event takes the session with it
            if up is None:
                return True
            if up in deleted:
                return False
            if up not in parents:
                live_in_log(up)
            up = parents.get(up)
        return True

    for where, ev in zip(wheres, batch):
        sid = ev.get("session")
        if sid is None:
            continue
        if not empty and ev.get("id") is not None and log.event_seq(ev["id"]) is not None:
            continue
        if ev["type"] == "session.created":
            if sid in created or (not empty and log.stream_version(sid) > 0):
                raise ValidationError(f"{where}.session", f"session {sid!r} already exists (or existed)",
                                      hint="omit the session.created event, or use a new session id")
            parent = (ev.get("data") or {}).get("parent_session_id")
            if parent is not None and not live(parent):
                raise ValidationError(f"{where}.data.parent_session_id", f"session {parent!r} does not exist")
            created.add(sid)
            parents[sid] = parent if isinstance(parent, str) else None
        elif not live(sid):
            if ev["type"] == "session.deleted" and sid not in deleted and (sid in created or own.get(sid)):
                # a cascade's later step: SessionStore deletes a session's descendants after it,
                # each by its own event, and the fold takes one whose ancestor is gone as a no-op
                deleted.add(sid)
                continue
            raise ValidationError(f"{where}.session", f"session {sid!r} does not exist",
                                  hint="create it first (a session.created event, or `eventlog sessions new`)")
        elif references and ev["type"] in MESSAGE_REFERENCES:
            # A reaction or a rewind names a message of its session by seq (an event already
            # in the log), as SessionStore.react/rewind require.
            mid = ev["data"]["message_id"]
            target = None if empty else log.get(mid)
            if target is None or target.get("type") != "message.appended" or target.get("session") != sid:
                raise ValidationError(f"{where}.data.message_id", f"message {mid} is not a message of session {sid!r}",
                                      hint="a message's id is the seq of its event (shown as [seq] by "
                                           "`eventlog sessions show SESSION`)")
        elif ev["type"] == "session.deleted":
            deleted.add(sid)
