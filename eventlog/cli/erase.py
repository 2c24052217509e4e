"""``eventlog retention`` and ``eventlog compact``: forgetting by age, and giving space back."""
from __future__ import annotations

import re
from typing import Any

import click

from eventlog.cli.common import Ctx, fail, handled, iso, json_option, pass_ctx, report, report_json
from eventlog.cli.isolate import isolated
from eventlog.errors import ValidationError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or a sum: ``1d12h``) in seconds."""
    parts = _DURATION.findall(text.strip().lower())
    if not parts or "".join(f"{n}{u}" for n, u in parts) != re.sub(r"\s+", "", text.strip().lower()):
        raise click.BadParameter(f"{text!r} is not a duration such as 30d, 12h, 90m, 45s or 2w",
                                 param_hint="--older-than")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@click.command("retention")
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Erase sessions whose last activity is older than this (30d, 12h, 90m, 45s, 2w).")
@click.option("--dry-run", is_flag=True, help="Only list the sessions that would be erased.")
@click.option("--reason", default="retention", show_default=True, help="Why, for the audit record.")
@json_option
@pass_ctx
@isolated()
@handled
def retention(c: Ctx, older_than: str, dry_run: bool, reason: str, as_json: bool) -> None:
    """Erase every lineage (a session and its descendants) whose last activity, in any of its
    sessions, is older than a duration."""
    seconds = parse_duration(older_than)
    with c.open_store() as store:
        try:
            out = store.retention(seconds, dry_run=dry_run, reason=reason)
        except ValidationError as e:  # the user gave it as --reason
            raise ValidationError("--reason", e.problem, hint=e.hint) if e.field == "reason" else e from None
    _warn_clock(out, seconds)
    if as_json:
        report_json(out)
        return
    verb = "would erase" if dry_run else "erased"
    n = len(out["sessions"])
    report("\n".join([f"{verb} {n} session{'s' if n != 1 else ''}" + ("" if dry_run else f" ({out['erased_events']} events)")
                       + f", inactive since before {iso(out['cutoff'])} UTC by this host's clock",
                       *(f"  {sid}" for sid in out["sessions"])]))


CLOCK_SLACK_S = 60.0
"""How far the log's newest event may be stamped past this host's clock before retention says
so (hosts sharing a PostgreSQL log differ by some milliseconds; an NTP step by a few seconds)."""


def _warn_clock(out: dict[str, Any], older_than: float) -> None:
    """Say (on stderr, before the report) when the host's clock and the log disagree: retention
    judges age by this clock alone, and a clock far ahead makes every session old."""
    cutoff, newest = out["cutoff"], out["newest"]
    if newest is None:
        return
    now = cutoff + older_than
    if out["sessions"] and older_than > 0 and newest < cutoff:
        click.echo(f"warning: every event in the log is older than the cutoff: the newest is of {iso(newest)} UTC, "
                   f"this host's clock says {iso(now)} UTC (hint: retention trusts this clock; if it is wrong, set it right "
                   "before the next retention, and use --dry-run to see what one would erase)", err=True)
    elif newest > now + CLOCK_SLACK_S:
        click.echo(f"warning: the log holds events stamped up to {iso(newest)} UTC, later than this host's clock "
                   f"({iso(now)} UTC): this clock is behind, or a writer's was ahead; a session written after "
                   "such an event ages from that time on", err=True)


@click.command("compact")
@json_option
@pass_ctx
@isolated()
@handled
def compact(c: Ctx, as_json: bool) -> None:
    """Rewrite the log file with only its live pages, giving freed space back (crash-safe)."""
    with c.open_store() as store:
        try:
            out = store.compact()
        except Exception as e:  # a backend without compaction: one line, exit 1
            from eventlog.errors import EventLogError

            if isinstance(e, EventLogError):
                raise
            fail(str(e))
            return
    if as_json:
        report_json(out)
    else:
        report(f"log compacted: {out['bytes_before']:,} bytes before, {out['bytes_after']:,} after "
                   f"(generation {out['generation']})")
