"""``eventlog init`` and ``eventlog append``: the profile's log, written directly."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterator

import click

from eventlog.cli.common import Ctx, emit_json, handled, json_option, pass_ctx
from eventlog.errors import ValidationError

if TYPE_CHECKING:
    pass


@click.command()
@pass_ctx
@handled
def init(c: Ctx) -> None:
    """Create the profile (its directory and log) if it does not exist."""
    with c.open_log(create=True) as log:
        click.echo(str(log.path.parent))


def _read_events(stream: Any) -> Iterator[tuple[int, Any]]:
    import orjson

    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise ValidationError(f"line {n}", f"not valid JSON ({e})") from None
        yield n, obj


def prepare_input(obj: Any, where: str) -> dict[str, Any]:
    """Validate one CLI input event against the catalogue; errors name ``where`` and the field."""
    from eventlog.sessions.events import CURRENT_VERSIONS, make_event

    if not isinstance(obj, dict):
        raise ValidationError(where, "an event must be a JSON object")
    unknown = sorted(set(obj) - {"type", "session", "data", "id"})
    if unknown:
        raise ValidationError(f"{where}.{unknown[0]}", "unknown envelope key")
    etype = obj.get("type")
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
