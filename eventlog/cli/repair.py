"""``eventlog rebuild`` and ``eventlog doctor``: check and repair the projections (never the log)."""
from __future__ import annotations

import sys

import click

from eventlog.cli.common import (
    Ctx,
    emit_json,
    handled,
    json_option,
    pass_ctx,
    progress_bar,
    read_flags,
    report,
    warn_flags,
)
from eventlog.cli.isolate import isolated


@click.command()
@click.option("--projection", "which", type=click.Choice(["state", "fts", "all"]), default="all", show_default=True,
              help="Which projection to rebuild.")
@pass_ctx
@isolated()
@handled
def rebuild(c: Ctx, which: str) -> None:
    """Rebuild projections from the log into new files and swap them in (the log is not written)."""
    from eventlog.errors import StorageError
    from projections import space
    from projections.db import converted

    d = c.profile_dir(create=False)
    why = space.cannot_write(d)
    if why is not None:
        raise StorageError(f"cannot rebuild the projections of {d}: {why}",
                           hint=f"{space.remedy(why)}, then retry")
    with c.open_store() as store, progress_bar(f"rebuilding {which}") as update:
        try:
            res = store.rebuild(which, progress=update)
        except (OSError, ValueError) as e:
            raise converted(e, "rebuilding the projections") from e
        except Exception as e:
            if type(e).__module__ != "sqlite3":
                raise
            raise converted(e, "rebuilding the projections") from e
        flags = read_flags(store)
    report(f"rebuilt {which}: {res['events']} events in {res['seconds']:.2f} s "
           f"({res['events_per_s']:,.0f} events/s)")
    warn_flags(flags)


@click.command()
@click.option("--fix", is_flag=True, help="Repair every projection problem by rebuilding (never writes the log).")
@click.option("--deep", is_flag=True,
              help="Also recompute the read models from the log and compare them with state.db and the FTS index.")
@json_option
@pass_ctx
@isolated()
@handled
def doctor(c: Ctx, fix: bool, deep: bool, as_json: bool) -> None:
    """Check the log, state.db, the FTS index, cursors, the lease, disk space and file permissions.

    Without --fix nothing is changed; exits 1 if anything is wrong. With --fix, exits 0 only if
    everything is ok afterwards. --deep compares every session's rows (and the index's
    documents) with the reference fold of the log, naming the first that differs; with --fix
    what differs is rebuilt.
    """
    from projections import space
    from projections.doctor import examine, repair

    if c.log_url is not None:  # the server first: a profile it does not have leaves nothing behind here
        c.open_log().close()
    d = c.profile_dir(create=False)
    actions: list[str] = []
    with c.open_log() as lg, progress_bar("checking") as update:
        if fix:
            actions = repair(d, lg, c.profile, deep=deep, progress=update)
        report = examine(d, lg, c.profile, deep=deep, progress=update)
    if fix:
        report["fixed"] = actions
    if as_json:
        emit_json(report)
    else:
        for part in ("log", "state", "fts", "lease", "disk", "permissions", "deep"):
            item = report.get(part)
            if item is None:
                continue
            status = item.get("status", "ok" if item["ok"] else "broken")
            if part == "log" and not item["ok"]:
                detail = f"{item.get('detail', '')} ({item.get('reason')})"
            elif part == "log" and (item.get("erase_pending") or item.get("unerased")):
                status = "unfinished"
                detail = item.get("detail") or ""
            else:
                detail = item.get("detail") or item.get("reason") or "; ".join(item.get("problems", [])) or ""
            if part == "deep" and item["ok"]:
                detail = f"matches the log up to seq {item['compared_seq']}"
            click.echo(f"{part:<12} {status:<11} {detail}")
        for name in report["log"].get("leftovers", []):
            click.echo(f"note: {name} is a copy of the log that a compaction stopped before its end left "
                       "(unless one is running now); the next `eventlog compact` removes it")
        for name in report["permissions"].get("displaced", []):
            click.echo(f"note: {name} was set aside (it stood where a projection pointer belongs); remove it "
                       "once you have looked")
        for a in actions:
            click.echo(f"fixed: {a}")
    if not report["ok"]:
        if not as_json:
            if not report["log"]["ok"] or report["log"].get("erase_pending") or report["log"].get("unerased"):
                hint = report["log"].get("hint")
            elif not report["disk"]["ok"]:
                hint = f"{space.remedy(str(report['disk'].get('detail') or ''))}; nothing is rebuilt until then"
            elif report["lease"].get("hint"):
                hint = report["lease"]["hint"]
            elif report["permissions"].get("hint"):
                hint = report["permissions"]["hint"]
            else:
                hint = None if fix else "run `eventlog doctor --fix`"
            click.echo("error: problems found" + (f" (hint: {hint})" if hint else ""), err=True)
        sys.exit(1)
