"""``eventlog demo``, behind ``python3 run demo``: a realistic agent conversation written, read back, verified."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import click

from eventlog.cli.common import Ctx, handled

DEMO_PROFILE = "demo"

_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Find the flaky test in the payments service and fix it."},
    {"role": "assistant", "content": "Let me search the test suite for timing-dependent code.",
     "reasoning": "Flaky usually means sleeps or ordering; grep for sleep first.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "grep", "arguments": '{"pattern": "sleep(", "path": "tests/"}'}}],
     "finish_reason": "tool_calls"},
    {"role": "tool", "tool_name": "grep", "tool_call_id": "call_1",
     "content": "tests/test_refunds.py:88:    time.sleep(0.1)  # wait for the webhook"},
    {"role": "assistant", "finish_reason": "stop",
     "content": "test_refunds waits a fixed 100 ms for the refund webhook, which is sometimes slower on CI. "
                "I replaced the sleep with an explicit wait on the webhook event (timeout 5 s)."},
]


def run_demo(home: Path, profile: str, echo: Callable[[str], None], log: str | None = None) -> bool:
    """Write a demo session into ``profile`` under ``home``, read it back, search it, verify the log.
    ``log``: where the profile's log is (``--log-url``: a ``postgresql://`` URL or an LMDB log
    directory); None: the LMDB log in the profile's directory.

    Returns True when everything checked out.
    """
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(home, profile, log=log) as store:
        title = store.next_title("Fix flaky payments test")
        sid = store.create_session(source="cli", model="demo-model", cwd="/work/payments",
                                   git_repo_root="/work/payments", git_branch="main", title=title)
        ids = store.append_messages(sid, _TURNS)
        store.record_usage(sid, model="demo-model", provider="demo", task="chat", input_tokens=1840,
                           output_tokens=212, estimated_cost_usd=0.0043)
        store.react(ids[-1], author="user", emoji="👍")
        store.end_session(sid, "completed")

        session = store.get_session(sid)
        assert session is not None
        where = ""
        if log is not None:  # the server's address without its password (psycopg is there: the log opened)
            from eventlog.log.pg_schema import is_url, redact

            where = f", its log at {redact(log) if is_url(log) else log}"
        echo(f"profile {profile!r} under {store.home}{where}")
        echo(f"session {sid}  {session['title']!r}  ({session['message_count']} messages, "
             f"{session['tool_call_count']} tool call, {session['input_tokens']}+{session['output_tokens']} tokens)")
        for m in store.get_messages(sid):
            text = m["content"] if isinstance(m["content"], str) else ""
            echo(f"  [{m['id']}] {m['role']:<9} {text[:72]}")
        hits = store.search("webhook", session_id=sid)["results"]
        echo(f"search 'webhook': {len(hits)} hits, e.g. {hits[0]['snippet'][:60]!r}" if hits else "search: no hits")
        listed = store.list_sessions(limit=5)
        echo(f"sessions in profile: {store.stats()['sessions']} (latest: {listed[0]['title']!r})")
        res = store.log.verify()
        health = store.health(full=False)
        echo(f"log verify: {'ok' if res.ok else 'BROKEN'} ({res.events} events, head {res.head_seq}); "
             f"state.db {health['state']['status']}, fts {health['fts']['status']}")
        return bool(res.ok and hits and health["ok"])


@click.command()
@click.pass_context
@handled
def demo(ctx: click.Context) -> None:
    """Write a realistic agent conversation into the demo profile (or the one --profile names), read
    it back, verify the log.

    Each run adds one more session (its title numbered: "... #2").
    """
    c: Ctx = ctx.obj
    given = ctx.parent is not None and ctx.parent.get_parameter_source("profile") == click.core.ParameterSource.COMMANDLINE
    profile = c.profile if given else DEMO_PROFILE
    if not run_demo(c.home, profile, click.echo, c.log_url):
        sys.exit(1)
