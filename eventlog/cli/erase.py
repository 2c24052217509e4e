"""``eventlog retention`` and ``eventlog compact``: forgetting by age, and giving space back."""
from __future__ import annotations

import re

import click

from eventlog.cli.common import Ctx, fail, handled, json_option, pass_ctx, report, report_json
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
    if as_json:
        report_json(out)
        return
    verb = "would erase" if dry_run else "erased"
    n = len(out["sessions"])
    report("\n".join([f"{verb} {n} session{'s' if n != 1 else ''}" + ("" if dry_run else f" ({out['erased_events']} events)"),
                       *(f"  {sid}" for sid in out["sessions"])]))


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
