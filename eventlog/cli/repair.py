"""``eventlog rebuild`` and ``eventlog doctor``: check and repair the projections (never the log)."""
from __future__ import annotations

import sys

import click

from eventlog.cli.common import Ctx, emit_json, handled, json_option, pass_ctx, progress_bar


@click.command()
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


@click.command()
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
