"""``eventlog log tail|verify|copy``: the event log itself (no projections, no SQLite)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from eventlog.cli.common import (
    Ctx,
    emit_json,
    emit_jsonl,
    handled,
    json_option,
    output_path,
    pass_ctx,
    progress_bar,
    report,
    report_json,
)
from eventlog.cli.isolate import isolated
from eventlog.errors import StorageError, ValidationError, printable

if TYPE_CHECKING:
    from eventlog.log.base import VerifyResult

INT64_MAX = 2**63 - 1
FOLLOW_POLL_S = 0.02


@click.group()
def log() -> None:
    """Inspect, verify and copy the event log itself."""


def _summary(env: dict[str, Any]) -> str:
    from datetime import datetime, timezone

    import orjson

    from eventlog.sessions.rules import event_time

    at = event_time(env.get("ts"))  # an imported export's envelope may carry any ts its hash covers
    ts = "unknown" if at is None else datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    data = orjson.dumps(env.get("data")).decode()
    if len(data) > 80:
        data = data[:77] + "..."
    line = f"{env['seq']:>8}  {ts:<27}  {env['type']:<24} {env.get('session') or '-'}  {data}"
    return printable(line)  # orjson escapes only C0 controls: C1, bidi overrides, U+2028 are raw


@log.command("tail")
@click.option("--from", "from_seq", type=click.IntRange(min=1, max=INT64_MAX), default=None, help="First seq to show.")
@click.option("--limit", type=click.IntRange(min=1, max=INT64_MAX), default=None,
              help="Show at most N events (default 20 without --from); with --follow, N before following.")
@click.option("--follow", is_flag=True, help="Keep printing events as they are appended (Ctrl-C stops).")
@json_option
@pass_ctx
@isolated()
@handled
def log_tail(c: Ctx, from_seq: int | None, limit: int | None, follow: bool, as_json: bool) -> None:
    """Print the last events of the log (JSONL envelopes with --json).

    With --follow, like ``tail -f``: the last N events (or N from --from), then every new one.
    Every event shown is checked against the chain first: at a damaged one the command stops
    with an error naming its seq (exit 1), after the events before it.
    """
    from eventlog.log.damage import Verified

    def show(env: dict[str, Any]) -> None:
        emit_jsonl(env) if as_json else click.echo(_summary(env))

    with c.open_log() as lg:
        head, _ = lg.head()
        if from_seq is None:
            from_seq = max(1, head - (limit or 20) + 1)
        shown = 0
        try:
            events = Verified(lg, from_seq, head, raw=False)
            for _seq, _raw, env in events:
                if limit is not None and shown >= limit:
                    break
                show(env)
                shown += 1
            else:
                if events.damage is not None:
                    raise events.damage.error_reading()
            if not follow:
                return
            # None: the hash of event nxt - 1 is read (and checked) first. --from beyond the head:
            # nothing before it is shown, not even what is appended meanwhile.
            nxt, prev = max(head + 1, from_seq), None
            while True:
                sys.stdout.flush()
                if prev is None and lg.head()[0] < nxt:
                    time.sleep(FOLLOW_POLL_S)
                    continue
                events = Verified(lg, nxt, None, prev, raw=False)
                for seq, _raw, env in events:
                    show(env)
                    nxt, prev = seq + 1, env["hash"]
                if events.damage is not None:
                    sys.stdout.flush()
                    raise events.damage.error_reading()
                time.sleep(FOLLOW_POLL_S)
        except KeyboardInterrupt:
            pass


@log.command("verify")
@json_option
@pass_ctx
@handled
def log_verify(c: Ctx, as_json: bool) -> None:
    """Recompute the hash chain; exit 1 naming the first bad seq if it is broken.

    A broken chain is recorded for every process (appends are refused, reads say where the
    projections stop); a chain that verifies again (a restored log) clears that record. A log
    on a server (--log-url postgresql://) keeps no such record.
    """
    from eventlog.cli.isolate import can_fork
    from eventlog.log import damage

    # On LMDB the walk runs in a child process first: liblmdb aborts a process whose cursor steps
    # onto a damaged page (an assertion, SIGABRT), and this is the command that must say so. Done
    # before the parent opens the log (py-lmdb cannot open it again in a child that inherited it),
    # where a fork is safe (its output comes back through a pipe: any stdout will do).
    isolated = _verify_isolated(c) if c.log_url is None and can_fork(c) else None
    with c.open_log() as lg:
        res, killed = isolated if isolated is not None else (lg.verify(), False)
        if res.ok:
            damage.clear(lg)  # restored: appends are accepted again
        elif res.first_bad_seq is not None:
            # a read that kills the process is not tried again while data.mdb is the same file
            stamp = damage.file_stamp(lg) if killed else None
            damage.record(lg, damage.Damage(res.first_bad_seq, res.reason or "fails the chain check", stamp))
    if as_json:
        emit_json(res.to_dict())
    elif res.ok:
        erased = f" ({res.erased} erased)" if res.erased else ""
        click.echo(f"ok: {res.events} events{erased}, head {res.head_seq} {res.head_hash}")
        if res.unerased:
            from projections.doctor import unerased_detail, unerased_hint

            click.echo(f"warning: {unerased_detail(res)}; {unerased_hint(res)}", err=True)
    else:
        at = f" at seq {res.first_bad_seq}" if res.first_bad_seq is not None else ""
        click.echo(f"BROKEN{at}: {res.reason}", err=True)
    if not res.ok:
        sys.exit(1)


def _verify_isolated(c: Ctx) -> tuple[VerifyResult, bool] | None:
    """``log verify`` of an LMDB log in a child process, and whether a signal killed it. When
    liblmdb kills it (a damaged page), the first event whose read does so is found by halving
    ranges, each read by another child, and reported as the first bad seq. None: the child
    raised (the caller verifies in-process and the error comes out as usual)."""
    from eventlog.cli.isolate import first_unreadable, in_child, signal_name
    from eventlog.log.base import VerifyResult

    def verify() -> Any:
        with c.open_log() as lg:
            return lg.verify().to_dict()

    kind, got = in_child(verify)
    if kind == "ok":
        return VerifyResult(**got), False
    if kind == "error":
        return None
    return first_unreadable(c, signal_name(got)), True


def _holds_log(path: Path) -> bool:
    """Whether the folder ``path`` holds a log. A compacted log keeps its data in <dir>/g<N>/
    (<dir>/data.mdb is then a link to nowhere), named by the <dir>/current link; a folder whose
    ``current`` is something else (a plain file, a deployment's link to a release) holds no log,
    and is not a damaged log to restore from a backup."""
    from eventlog.log.lmdb import generation_dir

    try:
        return (generation_dir(path) / "data.mdb").exists()
    except StorageError:
        return False


@log.command("copy")
@click.option("--to", "to", metavar="URL|DIR", default=None,
              help="Copy the profile's log to this log (a postgresql:// URL or an LMDB log directory).")
@click.option("--from", "from_", metavar="URL|DIR", default=None,
              help="Copy this log (a postgresql:// URL or an LMDB log directory) into the profile's log.")
@json_option
@pass_ctx
@isolated(outputs=("to",), source="from_")
@handled
def log_copy(c: Ctx, to: str | None, from_: str | None, as_json: bool) -> None:
    """Copy a log between backends keeping every seq and hash, then verify the copy.

    The receiving log must be empty or hold a prefix of the other (an interrupted copy resumes).
    The other side is the same profile name: on a server, that profile's log.
    """
    if (to is None) == (from_ is None):
        raise click.UsageError("give exactly one of --to and --from")
    from eventlog.log import open_log
    from eventlog.log.copy import copy_log

    other = to if to is not None else from_
    assert other is not None
    options: dict[str, Any] = {"create": True} if "://" in other else {}
    if to is not None and "://" not in to:  # a new log directory: where it goes is checked first
        path = output_path(to, "--to", c, directory=True)
        if path.is_dir() and not _holds_log(path) and any(path.iterdir()):
            names = sorted(p.name for p in path.iterdir())
            found = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise ValidationError("--to", f"{path} holds other files ({found}) and no log",
                                  hint="give a new folder name, an empty folder, or an existing log directory")
    with progress_bar("copying") as update:
        if to is not None:
            with c.open_log() as source, open_log(other, profile=c.profile, **options) as target:
                res = copy_log(source, target, progress=update)
                if int(getattr(target, "erase_pending", lambda: 0)()) and hasattr(target, "compact"):
                    target.compact()  # erase records stubbed events it held whole: their words leave its file
        else:
            with open_log(other, profile=c.profile, create=False) as source, c.open_log(create=True) as target:
                res = copy_log(source, target, progress=update)
                erased = c.erased_on_import(target)
            if erased:  # erase records stubbed events the profile held whole: clean its files
                c.clean_after_import()
    if as_json:
        report_json(res.to_dict())
    else:
        report(f"copied {res.copied} events ({res.skipped} already there); head {res.head_seq} {res.head_hash}; "
               f"verify ok")
