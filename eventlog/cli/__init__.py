"""The ``eventlog`` command line: thin commands over library calls.

Exit codes: 0 success, 1 a failed check or an error (one line on stderr, with a hint where
one helps), 2 bad usage (click's own handling).
"""
from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import click
import orjson

from eventlog import profiles
from eventlog.errors import EventLogError, NotFoundError, ValidationError
from eventlog.log import Log

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

    def open_store(self, *, create: bool = False, **options: Any) -> Any:
        from eventlog.sessions.store import SessionStore

        self.profile_dir(create=create)
        options.setdefault("follower", False)  # a one-shot command catches up on read instead
        return SessionStore.open(self.home, self.profile, **options)

    def open_log(self, *, create: bool = False) -> Any:
        from eventlog.log import EventLog

        return EventLog.open(self.profile_dir(create=create) / "log", profile=self.profile)


def fail(message: str) -> None:
    from eventlog.errors import printable

    click.echo(f"error: {printable(message)}", err=True)
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


@main.command()
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
        if seqs:
            _settle(c, log, max(seqs))
    if as_json:
        emit_json({"seqs": seqs})
    else:
        for s in seqs:
            click.echo(str(s))


def _settle(c: Ctx, log: Log, seq: int) -> None:
    """Bring the profile's projections (when it has any) up to ``seq`` before the command exits,
    so the next command, in another process, reads what this one appended (waits at most 5 s;
    the events are durable in the log either way)."""
    from projections import Projector, files

    p = Projector(c.profile_dir(create=False), log, c.profile)
    try:
        # Only healthy projections: a broken one is rebuilt by the next reader, not by an append.
        if files.read_pointer(p.state_pointer()) is not None and p.health(full=False)["ok"]:
            p.wait_for(seq, timeout=5.0)
    except EventLogError:
        pass  # the next reader's catch-up or a follower applies them
    finally:
        p.close()


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
    from eventlog.cli.demo import DEMO_PROFILE, run_demo

    c: Ctx = ctx.obj
    given = ctx.parent is not None and ctx.parent.get_parameter_source("profile") == click.core.ParameterSource.COMMANDLINE
    profile = c.profile if given else DEMO_PROFILE
    if not run_demo(c.home, profile, click.echo):
        sys.exit(1)


def progress_bar(label: str) -> Any:
    """A click progress bar on a terminal (stderr), a silent stand-in otherwise.

    Returns a context manager yielding ``update(done, total)``.
    """
    import contextlib

    @contextlib.contextmanager
    def bar() -> Iterator[Callable[[int, int], None]]:
        if not sys.stderr.isatty():
            yield lambda done, total: None
            return
        bars: list[Any] = []
        seen = [0]

        def update(done: int, total: int) -> None:
            if not bars:
                bars.append(click.progressbar(length=max(total, 1), label=label, file=sys.stderr))
                bars[0].__enter__()
            bars[0].update(done - seen[0])
            seen[0] = done

        try:
            yield update
        finally:
            if bars:
                bars[0].__exit__(None, None, None)

    return bar()


def _iso(t: Any) -> str:
    from datetime import datetime, timezone

    from eventlog.sessions.rules import MAX_TIME

    if not isinstance(t, (int, float)) or not 0 <= t <= MAX_TIME:
        return "unknown"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# ---------------------------------------------------------------------------- sessions


@main.group()
def sessions() -> None:
    """Create, list, show and change sessions."""


@sessions.command("new")
@click.option("--id", "sid", default=None, help="Session id (default: a fresh, time-sortable id).")
@click.option("--source", default=None, help="Where the session comes from (cli, gateway, cron, ...).")
@click.option("--title", default=None, help="A title; must not be held by another session.")
@click.option("--model", default=None, help="Model name.")
@click.option("--cwd", default=None, help="Working directory.")
@click.option("--parent", default=None, help="Parent session id (a continuation or branch).")
@pass_ctx
@handled
def sessions_new(c: Ctx, sid: str | None, source: str | None, title: str | None, model: str | None,
                 cwd: str | None, parent: str | None) -> None:
    """Create a session and print its id."""
    with c.open_store(create=True) as store:
        click.echo(store.create_session(sid, source=source, title=title, model=model, cwd=cwd,
                                        parent_session_id=parent))


@sessions.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Sessions per page.")
@click.option("--source", default=None, help="Only sessions from this source.")
@click.option("--archived", is_flag=True, help="Include archived sessions.")
@click.option("--pinned", is_flag=True, help="Only pinned sessions.")
@click.option("--workspace", default=None, help="Only sessions whose git root or cwd is at or under PATH.")
@json_option
@pass_ctx
@handled
def sessions_list(c: Ctx, limit: int, source: str | None, archived: bool, pinned: bool,
                  workspace: str | None, as_json: bool) -> None:
    """List sessions, most recent activity first (pinned ones always included)."""
    with c.open_store() as store:
        rows = store.list_sessions(source=source, archived=None if archived else False,
                                   pinned=True if pinned else None, workspace=workspace, limit=limit)
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        flags = ("P" if r["pinned"] else "-") + ("A" if r["archived"] else "-")
        click.echo(f"{r['id']}  {flags}  {_iso(r['last_activity_at'])}  {r['message_count']:>5} msgs  "
                   f"{r.get('source') or 'cli':<8} {r.get('title') or ''}")


@sessions.command("show")
@click.argument("session_id")
@click.option("--all", "include_inactive", is_flag=True, help="Include rewound messages.")
@json_option
@pass_ctx
@handled
def sessions_show(c: Ctx, session_id: str, include_inactive: bool, as_json: bool) -> None:
    """Show a session and its messages."""
    with c.open_store() as store:
        session = store.get_session(session_id)
        if session is None:
            raise NotFoundError("session", session_id)
        messages = store.get_messages(session_id, include_inactive=include_inactive)
    if as_json:
        emit_json({"session": session, "messages": messages})
        return
    click.echo(f"{session['id']}  {session.get('title') or '(untitled)'}")
    click.echo(f"source {session.get('source') or 'cli'}  model {session.get('model') or '-'}  "
               f"started {_iso(session.get('started_at'))}  messages {session['message_count']}")
    for m in messages:
        content = m["content"] if isinstance(m["content"], str) else orjson.dumps(m["content"]).decode()
        click.echo(f"[{m['id']}] {_iso(m['timestamp'])} {m['role']}: {(content or '')[:200]}")


def _simple_session_command(name: str, method: str, doc: str) -> None:
    @sessions.command(name, help=doc)
    @click.argument("session_id")
    @pass_ctx
    @handled
    def cmd(c: Ctx, session_id: str) -> None:
        with c.open_store() as store:
            seq = getattr(store, method)(session_id)
        click.echo(str(seq))


for _name, _doc in [("archive", "Archive a session and its lineage."),
                    ("unarchive", "Unarchive a session and its lineage."),
                    ("pin", "Pin a session and its lineage."),
                    ("unpin", "Unpin a session and its lineage."),
                    ("delete", "Delete a session and its descendants (a tombstone; the log keeps them).")]:
    _simple_session_command(_name, "delete_session" if _name == "delete" else _name, _doc)


@sessions.command("title")
@click.argument("session_id")
@click.argument("title")
@click.option("--source", "provenance", type=click.Choice(["user", "llm", "derived"]), default="user",
              show_default=True, help="Provenance: a lower one never replaces a higher one.")
@pass_ctx
@handled
def sessions_title(c: Ctx, session_id: str, title: str, provenance: str) -> None:
    """Set a session's title (titles are unique in a profile)."""
    with c.open_store() as store:
        seq = store.set_title(session_id, title, provenance)
    click.echo("kept the existing higher-provenance title" if seq is None else str(seq))


@sessions.command("end")
@click.argument("session_id")
@click.option("--reason", default="user", show_default=True, help="Why it ended (the first reason wins).")
@pass_ctx
@handled
def sessions_end(c: Ctx, session_id: str, reason: str) -> None:
    """End a session."""
    with c.open_store() as store:
        seq = store.end_session(session_id, reason)
    click.echo("already ended" if seq is None else str(seq))


# ---------------------------------------------------------------------------- messages


@main.group()
def messages() -> None:
    """Add messages to sessions."""


@messages.command("add")
@click.argument("session_id")
@click.option("--role", required=True, type=click.Choice(["system", "user", "assistant", "tool", "session_meta"]))
@click.option("--content", default=None, help="The message text.")
@click.option("--content-file", type=click.File("r", encoding="utf-8", errors="replace"), default=None,
              help="Read the message text from a file ('-' for stdin).")
@click.option("--tool-name", default=None, help="Tool name (for role tool).")
@json_option
@pass_ctx
@handled
def messages_add(c: Ctx, session_id: str, role: str, content: str | None, content_file: Any,
                 tool_name: str | None, as_json: bool) -> None:
    """Append a message and print its id (the seq of its event)."""
    if (content is None) == (content_file is None):
        raise click.UsageError("give exactly one of --content and --content-file")
    text = content if content is not None else content_file.read()
    with c.open_store() as store:
        mid = store.append_message(session_id, role, text, tool_name=tool_name)
    emit_json({"id": mid, "session_id": session_id}) if as_json else click.echo(str(mid))


# ---------------------------------------------------------------------------- search, stats


@main.command()
@click.argument("query")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--role", default=None, help="Only messages with this role.")
@click.option("--session", "session_id", default=None, help="Only messages of this session.")
@json_option
@pass_ctx
@handled
def search(c: Ctx, query: str, limit: int, role: str | None, session_id: str | None, as_json: bool) -> None:
    """Full-text search over messages (any text is accepted as a query)."""
    with c.open_store() as store:
        res = store.search(query, role=role, session_id=session_id, limit=limit)
    if as_json:
        emit_json(res)
        return
    if res["degraded"]:
        click.echo("warning: the search index is degraded; results come from a slower scan "
                   "(hint: eventlog rebuild --projection fts)", err=True)
    for r in res["results"]:
        click.echo(f"{r['session_id']}  [{r['message_id']}] {r['role']:<9} {_iso(r['timestamp'])}  {r['snippet']}")


# ---------------------------------------------------------------------------- projections


@main.command()
@click.option("--projection", "which", type=click.Choice(["state", "fts", "all"]), default="all", show_default=True,
              help="Which projection to rebuild.")
@pass_ctx
@handled
def rebuild(c: Ctx, which: str) -> None:
    """Rebuild projections from the log into new files and swap them in (the log is not written)."""
    with c.open_store() as store, progress_bar(f"rebuilding {which}") as update:
        res = store.rebuild(which, progress=update)
    click.echo(f"rebuilt {which}: {res['events']} events in {res['seconds']:.2f} s "
               f"({res['events_per_s']:,.0f} events/s)")


@main.command()
@click.option("--fix", is_flag=True, help="Repair every projection problem by rebuilding (never writes the log).")
@json_option
@pass_ctx
@handled
def doctor(c: Ctx, fix: bool, as_json: bool) -> None:
    """Check the log, state.db, the FTS index, cursors, the lease and file permissions.

    Without --fix nothing is changed; exits 1 if anything is wrong. With --fix, exits 0 only if
    everything is ok afterwards.
    """
    from projections.doctor import examine, repair

    d = c.profile_dir(create=False)
    actions: list[str] = []
    with c.open_log() as lg:
        if fix:
            actions = repair(d, lg, c.profile)
        report = examine(d, lg, c.profile)
    if fix:
        report["fixed"] = actions
    if as_json:
        emit_json(report)
    else:
        for part in ("log", "state", "fts", "permissions"):
            item = report[part]
            status = item.get("status", "ok" if item["ok"] else "broken")
            detail = item.get("detail") or item.get("reason") or "; ".join(item.get("problems", [])) or ""
            click.echo(f"{part:<12} {status:<11} {detail}")
        for a in actions:
            click.echo(f"fixed: {a}")
    if not report["ok"]:
        if not as_json:
            click.echo("error: problems found" + ("" if fix else " (hint: run `eventlog doctor --fix`)"), err=True)
        sys.exit(1)


def _parse_time_ns(text: str) -> int:
    from eventlog.sessions.events import parse_time

    try:
        return int(round(parse_time(text, "--as-of") * 1e9))
    except ValidationError as e:
        raise click.BadParameter(e.problem, param_hint="--as-of") from None


@main.command()
@click.option("--until", "until_seq", type=click.IntRange(min=0), default=None, help="Last seq to include.")
@click.option("--as-of", "as_of", default=None, help="ISO-8601 time: include events appended up to then.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The state.db file to write.")
@pass_ctx
@handled
def replay(c: Ctx, until_seq: int | None, as_of: str | None, out: str) -> None:
    """Write a standalone state.db (with its FTS index) of the profile as it was at a point."""
    if (until_seq is None) == (as_of is None):
        raise click.UsageError("give exactly one of --until and --as-of")
    as_of_ns = _parse_time_ns(as_of) if as_of is not None else None
    with c.open_store() as store, progress_bar("replaying") as update:
        res = store.snapshot(out, until_seq=until_seq, as_of_ns=as_of_ns, progress=update)
    click.echo(f"wrote {out}: {res['events']} events, up to seq {res['last_seq']}")


@main.command()
@json_option
@pass_ctx
@handled
def stats(c: Ctx, as_json: bool) -> None:
    """Sessions and messages by source, token and cost totals, log size and head, projection lag."""
    with c.open_store() as store:
        body = store.stats()
        head, head_hash = store.log.head()
        body["log"] = {"head_seq": head, "head_hash": head_hash, "size_bytes": store.log.size_bytes()}
        body["projection"] = {"lag": store.projection_lag(), "degraded": bool(store.health(full=False)["fts"]["degraded"])}
    if as_json:
        emit_json(body)
        return
    click.echo(f"sessions {body['sessions']}  messages {body['messages']}")
    for src, row in sorted(body["by_source"].items()):
        click.echo(f"  {src:<12} {row['sessions']:>6} sessions {row['messages']:>8} messages")
    click.echo(f"tokens in {body['input_tokens']} out {body['output_tokens']} cache-read {body['cache_read_tokens']} "
               f"cache-write {body['cache_write_tokens']} reasoning {body['reasoning_tokens']}")
    cost = body["estimated_cost_usd"]
    click.echo(f"estimated cost {'unknown' if cost is None else f'${cost:.4f}'}")
    click.echo(f"log head {head} ({body['log']['size_bytes']:,} bytes)  projection lag {body['projection']['lag']}")


# ---------------------------------------------------------------------------- export, import


@main.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "sqlite", "md", "html"]), default="jsonl",
              show_default=True, help="jsonl: the log itself; sqlite: a state.db snapshot; md/html: a transcript.")
@click.option("--session", "session_id", default=None, help="Only this session (required for md and html).")
@click.argument("out", type=click.Path(dir_okay=False, allow_dash=True))
@pass_ctx
@handled
def export_cmd(c: Ctx, fmt: str, session_id: str | None, out: str) -> None:
    """Export the profile to OUT ('-' for stdout with jsonl, md and html)."""
    if fmt in ("md", "html") and session_id is None:
        raise click.UsageError(f"--format {fmt} needs --session ID")
    if fmt == "sqlite" and out == "-":
        raise click.UsageError("--format sqlite needs a file name")
    if fmt == "jsonl":
        from sqlite_export.jsonl import export_jsonl

        with c.open_log() as lg, _output(out) as fp, progress_bar("exporting") as update:
            n = export_jsonl(lg, fp, session=session_id, progress=update)
        click.echo(f"exported {n} events", err=True)
        return
    with c.open_store() as store:
        if fmt == "sqlite":
            if session_id is not None:
                raise click.UsageError("--format sqlite snapshots the whole profile; drop --session")
            with progress_bar("snapshot") as update:
                info = store.snapshot(out, progress=update)
            click.echo(f"wrote {out} ({info['events']} events, up to seq {info['last_seq']})", err=True)
            return
        from sqlite_export.transcript import render_html, render_markdown

        assert session_id is not None
        session = store.get_session(session_id)
        if session is None:
            raise NotFoundError("session", session_id)
        msgs = store.get_messages(session_id)
    text = (render_markdown if fmt == "md" else render_html)(session, msgs)
    with _output(out) as fp:
        fp.write(text.encode("utf-8"))


@contextlib.contextmanager
def _output(name: str) -> Iterator[Any]:
    """A binary output: stdout for '-', else the file written atomically (profiles.atomic_write)."""
    if name == "-":
        try:
            yield sys.stdout.buffer
        finally:
            sys.stdout.flush()
        return
    with profiles.atomic_write(name, mode=profiles.USER_FILE_MODE) as fp:
        yield fp


@main.command("import")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "hermes"]), default="jsonl", show_default=True,
              help="jsonl: an eventlog export; hermes: an existing agent state.db (read-only).")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@json_option
@pass_ctx
@handled
def import_cmd(c: Ctx, fmt: str, file: str, as_json: bool) -> None:
    """Import FILE into the profile (created if it does not exist)."""
    if fmt == "jsonl":
        from sqlite_export.jsonl import import_jsonl

        with c.open_log(create=True) as lg, progress_bar("importing") as update:
            if file == "-":
                res = import_jsonl(lg, sys.stdin.buffer, progress=update)
            else:
                with open(file, "rb") as fp:
                    res = import_jsonl(lg, fp, progress=update)
        report = res.to_dict()
    else:
        from sqlite_export.hermes import import_hermes

        with c.open_store(create=True) as store, progress_bar("importing") as update:
            rep = import_hermes(store, Path(file), progress=update)
        report = rep.to_dict()
        for w in rep.warnings[:50]:
            click.echo(f"warning: {w}", err=True)
        if len(rep.warnings) > 50:
            click.echo(f"warning: ... and {len(rep.warnings) - 50} more", err=True)
    if as_json:
        emit_json(report)
    else:
        click.echo(" ".join(f"{k}={v}" for k, v in report.items() if not isinstance(v, list)))


if __name__ == "__main__":  # pragma: no cover
    main()
