"""``eventlog init`` and ``eventlog append``: the profile's log, written directly."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterator

import click

from eventlog.cli.common import Ctx, emit_json, handled, json_option, pass_ctx
from eventlog.errors import ValidationError

if TYPE_CHECKING:
    from eventlog.log import Log


@click.command()
@pass_ctx
@handled
def init(c: Ctx) -> None:
    """Create the profile (its directory and log) if it does not exist.

    Prints where its log is: the profile's directory, or the server (without a password)."""
    with c.open_log(create=True) as log:
        if log.path is not None:
            click.echo(str(log.path.parent))
        else:  # a log on a server (--log-url): its address, without a password, and the profile
            from eventlog.log.pg_schema import redact

            click.echo(f"{redact(c.log_url or '')} profile {c.profile}")


def _read_events(stream: Any) -> Iterator[tuple[int, Any]]:
    import orjson

    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise ValidationError(f"line {n}", f"not valid JSON ({e})") from None
        _refuse_duplicate_keys(line, f"line {n}")
        yield n, obj


class _DuplicateKey(Exception):
    pass


def _refuse_duplicate_keys(line: str | bytes, where: str) -> None:
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


def prepare_input(obj: Any, where: str) -> dict[str, Any]:
    """Validate one CLI input event against the catalogue; errors name ``where`` and the field."""
    from eventlog.sessions.events import CURRENT_VERSIONS, make_event

    if not isinstance(obj, dict):
        raise ValidationError(where, "an event must be a JSON object")
    unknown = sorted(set(obj) - {"type", "session", "data", "id"})
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


@click.command()
@click.option("--each", is_flag=True, help="Append every line as its own batch (default: one atomic batch).")
@json_option
@pass_ctx
@handled
def append(c: Ctx, each: bool, as_json: bool) -> None:
    """Append JSONL events from stdin: one {"type", "session"?, "data", "id"?} per line.

    Every line is validated and normalized as SessionStore does before anything is appended;
    the whole input is one atomic batch unless --each. Prints the assigned seqs (with --each,
    as each line lands, so a later failure still shows what was appended).
    """
    lines = list(_read_events(sys.stdin))
    batch = [prepare_input(obj, f"line {n}") for n, obj in lines]
    seqs: list[int] = []
    with c.open_log(create=True) as log:
        _check_sessions(log, [n for n, _ in lines], batch)
        if each:
            for ev in batch:
                got = log.append([ev])
                seqs.extend(got)
                if not as_json:
                    click.echo(str(got[0]))
            if not as_json:
                return
        else:
            seqs = log.append(batch)
    if as_json:
        emit_json({"seqs": seqs})
    else:
        for s in seqs:
            click.echo(str(s))


def _check_sessions(log: Log, numbers: list[int], batch: list[dict[str, Any]]) -> None:
    """Refuse, before anything is appended, what SessionStore refuses about sessions: an event
    of a session that does not exist (never created, or deleted — its own stream or an
    ancestor's), a ``session.created`` whose id was used before or whose parent does not exist.
    Earlier lines of the input count. A line whose ``id`` is already in the log is left to the
    log (an idempotent replay, or refused). Judged from the log's session streams alone: a
    writer never brings the projections up to date (the next reader does)."""
    if not any(ev.get("session") is not None for ev in batch):
        return
    from eventlog.sessions.events import MESSAGE_REFERENCES  # not at import: `append --help` stays light
    empty = log.head()[0] == 0  # an empty log holds no session yet
    known: dict[str, bool] = {}
    parents: dict[str, str | None] = {}  # of the sessions looked at: their parent

    def live_in_log(s: str, depth: int = 0) -> bool:
        if empty:
            return False
        if s not in known:
            created = gone = False
            parent = None
            for env in log.read_session(s):
                if env.get("erased"):  # an erase takes a whole stream: gone for good
                    gone = True
                elif env.get("type") == "session.created":
                    created = True
                    data = env.get("data")
                    parent = data.get("parent_session_id") if isinstance(data, dict) else None
                elif env.get("type") == "session.deleted":
                    gone = True
            parents[s] = parent if isinstance(parent, str) else None
            known[s] = created and not gone and (not isinstance(parent, str) or depth > 64
                                                 or live_in_log(parent, depth + 1))
        return known[s]

    created: set[str] = set()
    deleted: set[str] = set()
    for n, ev in zip(numbers, batch):
        sid = ev.get("session")
        if sid is None:
            continue
        if not empty and ev.get("id") is not None and log.event_seq(ev["id"]) is not None:
            continue

        def live(s: str) -> bool:
            if s in deleted or not (s in created or live_in_log(s)):
                return False
            up = parents.get(s)
            for _ in range(65):  # an ancestor deleted by an earlier line takes the session with it
                if up is None:
                    return True
                if up in deleted:
                    return False
                if up not in parents:
                    live_in_log(up)
                up = parents.get(up)
            return True

        if ev["type"] == "session.created":
            if sid in created or (not empty and log.stream_version(sid) > 0):
                raise ValidationError(f"line {n}.session", f"session {sid!r} already exists (or existed)",
                                      hint="omit the session.created event, or use a new session id")
            parent = (ev.get("data") or {}).get("parent_session_id")
            if parent is not None and not live(parent):
                raise ValidationError(f"line {n}.data.parent_session_id", f"session {parent!r} does not exist")
            created.add(sid)
            parents[sid] = parent if isinstance(parent, str) else None
        elif not live(sid):
            raise ValidationError(f"line {n}.session", f"session {sid!r} does not exist",
                                  hint="create it first (a session.created event, or `eventlog sessions new`)")
        elif ev["type"] in MESSAGE_REFERENCES:
            # A reaction or a rewind names a message of its session by seq (an event already
            # in the log), as SessionStore.react/rewind require.
            mid = ev["data"]["message_id"]
            target = None if empty else log.get(mid)
            if target is None or target.get("type") != "message.appended" or target.get("session") != sid:
                raise ValidationError(f"line {n}.data.message_id", f"message {mid} is not a message of session {sid!r}",
                                      hint="a message's id is the seq of its event: `eventlog messages list SESSION`")
        elif ev["type"] == "session.deleted":
            deleted.add(sid)
