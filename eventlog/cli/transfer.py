"""``eventlog export``, ``import`` and ``replay``: a profile's data out to files and in from them."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import IO, Iterator

import click

from eventlog.cli.common import Ctx, emit_json, handled, json_option, pass_ctx, progress_bar
from eventlog.errors import NotFoundError, ValidationError


def _parse_time_ns(text: str) -> int:
    from eventlog.sessions.events import parse_time

    try:
        return int(round(parse_time(text, "--as-of") * 1e9))
    except ValidationError as e:
        raise click.BadParameter(e.problem, param_hint="--as-of") from None


@click.command()
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


@click.command("export")
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

        with c.open_log() as lg, _Output(out) as fp, progress_bar("exporting") as update:
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
    with _Output(out) as fp:
        fp.write(text.encode("utf-8"))


@contextlib.contextmanager
def _Output(name: str) -> Iterator[IO[bytes]]:
    """A binary output: stdout for '-', else the file written atomically (profiles.atomic_write)."""
    if name == "-":
        try:
            yield sys.stdout.buffer
        finally:
            sys.stdout.flush()
        return
    from eventlog import profiles

    with profiles.atomic_write(name, mode=profiles.USER_FILE_MODE) as fp:
        yield fp


@click.command("import")
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
