"""The ``eventlog`` command line: thin commands over library calls.

Exit codes: 0 success, 1 a failed check or an error (one line on stderr, with a hint where
one helps), 2 bad usage (click's own handling).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import click
import orjson

from eventlog import profiles
from eventlog.errors import EventLogError, NotFoundError, ValidationError

_OPTS = orjson.OPT_SORT_KEYS


class Ctx:
    """What the global options select: a home and a profile."""

    def __init__(self, home: str | None, profile: str) -> None:
        self.home = profiles.resolve_home(home)
        self.profile = profile

    def profile_dir(self, *, create: bool) -> Path:
        d = profiles.profile_dir(self.home, self.profile, create=create)
        if not create and not (d / "log").is_dir():
            raise NotFoundError("profile", self.profile)
        return d

    def open_log(self, *, create: bool = False) -> Any:
        from eventlog.log import EventLog

        return EventLog.open(self.profile_dir(create=create) / "log", profile=self.profile)


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def handled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one line on stderr and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EventLogError as e:
            fail(str(e))
        except BrokenPipeError:
            sys.exit(0)

    return wrapper


def emit_json(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=_OPTS | orjson.OPT_INDENT_2).decode())


def emit_jsonl(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=_OPTS).decode())


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", type=click.Path(file_okay=False), default=None, envvar="EVENTLOG_HOME",
              help="Home directory (default: $EVENTLOG_HOME or ~/.eventlog).")
@click.option("--profile", default=profiles.DEFAULT_PROFILE, show_default=True, help="Profile name.")
@click.pass_context
def main(ctx: click.Context, home: str | None, profile: str) -> None:
    """eventlog: an event-sourced session store for AI-agent runtimes."""
    try:
        profiles.validate_profile(profile)
    except ValidationError as e:
        raise click.BadParameter(str(e), param_hint="--profile") from None
    ctx.obj = Ctx(home, profile)


pass_ctx = click.make_pass_decorator(Ctx)


@main.command()
@pass_ctx
@handled
def init(c: Ctx) -> None:
    """Create the profile (its directory and log) if it does not exist."""
    with c.open_log(create=True) as log:
        click.echo(str(log.path.parent))


def _read_events(stream: Any) -> Iterator[tuple[int, dict[str, Any]]]:
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
    from eventlog.events import CURRENT_VERSIONS, make_event

    if not isinstance(obj, dict):
        raise ValidationError(where, "an event must be a JSON object")
    unknown = sorted(set(obj) - {"type", "session", "data", "id"})
    if unknown:
        raise ValidationError(f"{where}.{unknown[0]}", "unknown envelope key")
    etype = obj.get("type")
    if etype not in CURRENT_VERSIONS:
        raise ValidationError(f"{where}.type", f"unknown event type {etype!r}",
                              hint="see docs/EVENTS.md for the catalogue")
    try:
        return make_event(etype, obj.get("session"), obj.get("data"), id=obj.get("id"))
    except ValidationError as e:
        raise ValidationError(f"{where}.{e.field}", e.problem, hint=e.hint) from None


@main.command()
@click.option("--each", is_flag=True, help="Append every line as its own batch (default: one atomic batch).")
@json_option
@pass_ctx
@handled
def append(c: Ctx, each: bool, as_json: bool) -> None:
    """Append JSONL events from stdin: one {"type", "session"?, "data", "id"?} per line.

    Known session event types are validated and normalized as SessionStore does; the whole
    input is one atomic batch unless --each. Prints the assigned seqs.
    """
    lines = list(_read_events(sys.stdin))
    batch = [prepare_input(obj, f"line {n}") for n, obj in lines]
    seqs: list[int] = []
    with c.open_log(create=True) as log:
        if each:
            for ev in batch:
                seqs.extend(log.append([ev]))
        else:
            seqs = log.append(batch)
    if as_json:
        emit_json({"seqs": seqs})
    else:
        for s in seqs:
            click.echo(str(s))


@main.group()
def log() -> None:
    """Inspect the event log itself."""


def _summary(env: dict[str, Any]) -> str:
    from datetime import datetime, timezone

    ts = datetime.fromtimestamp(env["ts"] / 1e9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    data = orjson.dumps(env.get("data")).decode()
    if len(data) > 80:
        data = data[:77] + "..."
    return f"{env['seq']:>8}  {ts}  {env['type']:<24} {env.get('session') or '-'}  {data}"


@log.command("tail")
@click.option("--from", "from_seq", type=click.IntRange(min=1), default=None, help="First seq to show.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most N events (default 20 without --from).")
@click.option("--follow", is_flag=True, help="Keep printing events as they are appended (Ctrl-C stops).")
@json_option
@pass_ctx
@handled
def log_tail(c: Ctx, from_seq: int | None, limit: int | None, follow: bool, as_json: bool) -> None:
    """Print the last events of the log (JSONL envelopes with --json)."""
    with c.open_log() as lg:
        head, _ = lg.head()
        if from_seq is None:
            n = limit or 20
            from_seq = max(1, head - n + 1)
        shown = 0
        source = lg.follow(from_seq) if follow else lg.read(from_seq)
        try:
            for env in source:
                if limit is not None and shown >= limit:
                    break
                emit_jsonl(env) if as_json else click.echo(_summary(env))
                shown += 1
                if follow:
                    sys.stdout.flush()
        except KeyboardInterrupt:
            pass


@log.command("verify")
@json_option
@pass_ctx
@handled
def log_verify(c: Ctx, as_json: bool) -> None:
    """Recompute the hash chain; exit 1 naming the first bad seq if it is broken."""
    with c.open_log() as lg:
        res = lg.verify()
    if as_json:
        emit_json(res.to_dict())
    elif res.ok:
        click.echo(f"ok: {res.events} events, head {res.head_seq} {res.head_hash}")
    else:
        click.echo(f"BROKEN at seq {res.first_bad_seq}: {res.reason}", err=True)
    if not res.ok:
        sys.exit(1)


@main.command()
@click.pass_context
@handled
def demo(ctx: click.Context) -> None:
    """Write a realistic agent conversation into the demo profile, read it back, verify the log."""
    from eventlog.demo import DEMO_PROFILE, run_demo

    c: Ctx = ctx.obj
    profile = c.profile if ctx.parent and ctx.parent.get_parameter_source("profile") == click.core.ParameterSource.COMMANDLINE else DEMO_PROFILE
    if not run_demo(c.home, profile, click.echo):
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
