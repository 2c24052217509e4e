"""``eventlog stats``: totals of a profile, its log's head and size, and projection lag."""
from __future__ import annotations

import click

from eventlog.cli.common import Ctx, emit_json, handled, json_flags, json_option, pass_ctx, read_flags, warn_flags
from eventlog.cli.isolate import isolated
from eventlog.errors import printable


@click.command()
@json_option
@pass_ctx
@isolated()
@handled
def stats(c: Ctx, as_json: bool) -> None:
    """Sessions and messages by source, token and cost totals, log size and head, projection lag."""
    with c.open_store() as store:
        body = store.stats()
        head, head_hash = store.log.head()
        body["log"] = {"head_seq": head, "head_hash": head_hash, "size_bytes": store.log.size_bytes()}
        health = store.health(full=False)
        flags = read_flags(store, health)
        body["projection"] = {"lag": store.projection_lag(),
                              "degraded": bool(health["fts"]["degraded"]) or bool(flags.get("degraded")),
                              **{k: v for k, v in json_flags(flags).items() if k != "degraded"}}
    warn_flags(flags)
    if as_json:
        emit_json(body)
        return
    click.echo(f"sessions {body['sessions']}  messages {body['messages']}")
    for src, row in sorted(body["by_source"].items()):
        click.echo(f"  {printable(src):<12} {row['sessions']:>6} sessions {row['messages']:>8} messages")
    click.echo(f"tokens in {body['input_tokens']} out {body['output_tokens']} cache-read {body['cache_read_tokens']} "
               f"cache-write {body['cache_write_tokens']} reasoning {body['reasoning_tokens']}")
    cost = body["estimated_cost_usd"]
    click.echo(f"estimated cost {'unknown' if cost is None else f'${cost:.4f}'}")
    click.echo(f"log head {head} ({body['log']['size_bytes']:,} bytes)  projection lag {body['projection']['lag']}")
