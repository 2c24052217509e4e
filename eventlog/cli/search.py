"""``eventlog search``: full-text search over a profile's messages."""
from __future__ import annotations

import click

from eventlog.cli.common import (
    Ctx,
    emit_json,
    handled,
    iso,
    json_flags,
    json_option,
    options_named,
    pass_ctx,
    read_flags,
    warn_flags,
)
from eventlog.cli.isolate import isolated
from eventlog.errors import NotFoundError, printable


@click.command()
@click.argument("query")
@click.option("--limit", type=click.IntRange(min=1, max=2**63 - 1), default=20, show_default=True,
              help="At most N results.")
@click.option("--role", default=None, type=click.Choice(("assistant", "session_meta", "system", "tool", "user")),
              help="Only messages with this role.")
@click.option("--session", "session_id", default=None, help="Only messages of this session.")
@json_option
@pass_ctx
@isolated()
@handled
def search(c: Ctx, query: str, limit: int, role: str | None, session_id: str | None, as_json: bool) -> None:
    """Full-text search over messages (any text is accepted as a query)."""
    with c.open_store() as store, options_named({"session_id": "--session"}):
        if session_id is not None and store.get_session(session_id) is None:
            # as `sessions show` and `export --session` say: a mistyped id is not an empty answer
            raise NotFoundError("session", session_id)
        res = store.search(query, role=role, session_id=session_id, limit=limit)
        flags = read_flags(store)
    warn_flags(flags)
    if flags:
        res = {**res, **json_flags(flags), "degraded": res["degraded"] or bool(flags.get("degraded"))}
    if as_json:
        emit_json(res)
        return
    if res["degraded"] and not flags.get("degraded"):
        click.echo("warning: the search index is degraded; results come from a slower scan "
                   "(hint: eventlog rebuild --projection fts)", err=True)
    for r in res["results"]:
        click.echo(f"{r['session_id']}  [{r['message_id']}] {r['role']:<9} {iso(r['timestamp'])}  "
                   f"{printable(r['snippet'])}")
