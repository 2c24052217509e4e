"""``eventlog sessions ...``: create, list, show and change sessions through SessionStore."""
from __future__ import annotations

import os
from typing import Any

import click

from eventlog.cli.common import (
    Ctx,
    emit_json,
    free_title_hint,
    handled,
    iso,
    json_flags,
    json_option,
    options_named,
    pass_ctx,
    read_flags,
    report,
    report_json,
    warn_flags,
)
from eventlog.cli.isolate import isolated
from eventlog.errors import NotFoundError, printable

SESSION_ARG = {"session": "SESSION_ID"}
"""A refused session id names the argument, as ``--help`` shows it."""


def shown_source(source: str | None) -> str:
    """A session's source as text output shows it: none given reads as "cli" (as the source filter
    matches it); an empty one as "" -- shown as "cli" it was listed under a source `--source cli`
    does not find."""
    return "cli" if source is None else (printable(source) if source else '""')


@click.group()
def sessions() -> None:
    """Create, list, show and change sessions."""


@sessions.command("new")
@click.option("--id", "sid", default=None, help="Session id (default: a fresh, time-sortable id).")
@click.option("--source", default=None, help="Where the session comes from (cli, gateway, cron, ...).")
@click.option("--title", default=None, help="A title; must not be held by another session.")
@click.option("--model", default=None, help="Model name.")
@click.option("--cwd", default=None, help="Working directory (relative to this folder).")
@click.option("--parent", default=None, help="Parent session id (a continuation or branch).")
@pass_ctx
@handled
def sessions_new(c: Ctx, sid: str | None, source: str | None, title: str | None, model: str | None,
                 cwd: str | None, parent: str | None) -> None:
    """Create a session and print its id."""
    if cwd and not os.path.isabs(cwd):
        cwd = os.path.abspath(cwd)  # `--cwd .` is this folder, as `sessions list --workspace .` reads it
    with c.open_store(create=True) as store, options_named({"id": "--id", "session": "--id", "source": "--source",
                                                        "title": "--title", "model": "--model", "cwd": "--cwd",
                                                        "parent_session_id": "--parent"}), free_title_hint(store):
        report(store.create_session(sid, source=source, title=title, model=model, cwd=cwd,
                                        parent_session_id=parent))


@sessions.command("list")
@click.option("--limit", type=click.IntRange(min=1, max=2**63 - 1), default=50, show_default=True, help="Sessions per page.")
@click.option("--source", default=None, help="Only sessions from this source.")
@click.option("--archived", is_flag=True, help="Include archived sessions.")
@click.option("--pinned", is_flag=True, help="Only pinned sessions.")
@click.option("--hidden", is_flag=True, help="Include hidden sessions (hidden through the Python API or Hermes).")
@click.option("--workspace", default=None,
              help="Only sessions whose git root or cwd is at or under PATH (relative to this folder; "
                   "normalised: /a/b/ is /a/b).")
@json_option
@pass_ctx
@isolated()
@handled
def sessions_list(c: Ctx, limit: int, source: str | None, archived: bool, pinned: bool, hidden: bool,
                  workspace: str | None, as_json: bool) -> None:
    """List sessions, most recent activity first (pinned ones always included)."""
    if workspace and not os.path.isabs(workspace):
        workspace = os.path.abspath(workspace)  # `--workspace .` is this folder, as everywhere on a command line
    with c.open_store() as store, options_named({"workspace": "--workspace", "source": "--source", "limit": "--limit"}):
        rows = store.list_sessions(source=source, archived=None if archived else False,
                                   pinned=True if pinned else None, hidden=None if hidden else False,
                                   workspace=workspace, limit=limit)
        warn_flags(read_flags(store))
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        flags = ("P" if r["pinned"] else "-") + ("A" if r["archived"] else "-") + ("H" if r.get("hidden") else "")
        click.echo(f"{r['id']}  {flags}  {iso(r['last_activity_at'])}  {r['message_count']:>5} msgs  "
                   f"{shown_source(r.get('source')):<8} {printable(r.get('title') or '')}")


@sessions.command("show")
@click.argument("session_id")
@click.option("--all", "include_inactive", is_flag=True, help="Include rewound messages.")
@json_option
@pass_ctx
@isolated()
@handled
def sessions_show(c: Ctx, session_id: str, include_inactive: bool, as_json: bool) -> None:
    """Show a session and its messages."""
    with c.open_store() as store:
        session = store.get_session(session_id)
        if session is None:
            raise NotFoundError("session", session_id)
        messages = store.get_messages(session_id, include_inactive=include_inactive)
        flags = read_flags(store)
    warn_flags(flags)
    if as_json:
        emit_json({"session": session, "messages": messages, **json_flags(flags)})
        return

    click.echo(f"{session['id']}  {printable(session.get('title') or '(untitled)')}")
    click.echo(f"source {shown_source(session.get('source'))}  model {printable(session.get('model') or '-')}  "
               f"started {iso(session.get('started_at'))}  messages {session['message_count']}")
    from sqlite_export.transcript import call_names

    names = call_names(messages)
    for m in messages:
        flag = "" if m.get("active", True) else " (rewound)"
        click.echo(f"[{m['id']}]{flag} {iso(m['timestamp'])} {m['role']}: {printable(_message_text(m, names))}")


def _message_text(m: dict[str, Any], names: dict[str, str] | None = None) -> str:
    """One line for a message: its text (a multimodal part list as JSON), then its tool calls
    (``-> name(arguments)``); at most 200 characters each. An assistant message with a tool name
    and no tool calls is one call, its content the arguments; a tool result without a name is
    named after the call its ``tool_call_id`` answers (``names``)."""
    import orjson

    content = m.get("content")
    text = content if isinstance(content, str) else "" if content is None else orjson.dumps(content).decode()
    parts = [" ".join(text.split())[:200]] if text else []
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                args = fn.get("arguments")
                args = args if isinstance(args, str) else orjson.dumps(args).decode()
                parts.append(f"-> {fn.get('name')}({' '.join(args.split())[:200]})")
            else:
                parts.append(f"-> {orjson.dumps(call).decode()[:200]}")
    tool_name = m.get("tool_name") or (names or {}).get(m.get("tool_call_id") or "")
    if tool_name and m.get("role") == "tool":
        parts.insert(0, f"[{tool_name}]")
    elif isinstance(m.get("tool_name"), str) and m.get("role") == "assistant" and not (isinstance(calls, list) and calls):
        # one tool call whose content is its arguments (the OpenAI Agents SDK adapter's function calls)
        parts = [f"-> {m['tool_name']}({' '.join(text.split())[:200]})"]
    return "  ".join(parts) if parts else "(no content)"


def _simple_session_command(name: str, method: str, done: str, doc: str) -> None:
    """``eventlog sessions NAME ID``: call ``store.<method>(ID)`` and say what it did."""

    @sessions.command(name, help=doc)
    @click.argument("session_id")
    @pass_ctx
    @handled
    def cmd(c: Ctx, session_id: str) -> None:
        with c.open_store() as store, options_named(SESSION_ARG):
            seq = getattr(store, method)(session_id)
        report(f"{done.format(session_id)} (event seq {seq})")


for _name, _method, _done, _doc in [
    ("archive", "archive", "archived session {} and its lineage", "Archive a session and its lineage."),
    ("unarchive", "unarchive", "unarchived session {} and its lineage", "Unarchive a session and its lineage."),
    ("pin", "pin", "pinned session {} and its lineage", "Pin a session and its lineage."),
    ("unpin", "unpin", "unpinned session {} and its lineage", "Unpin a session and its lineage."),
    ("delete", "delete_session", "deleted session {} and its descendants (the log keeps them)",
     "Delete a session and its descendants (a tombstone; the log keeps them)."),
]:
    _simple_session_command(_name, _method, _done, _doc)


@sessions.command("title")
@click.argument("session_id")
@click.argument("title")
@click.option("--source", "provenance", type=click.Choice(["user", "llm", "derived"]), default="user",
              show_default=True, help="Provenance: a lower one never replaces a higher one.")
@pass_ctx
@handled
def sessions_title(c: Ctx, session_id: str, title: str, provenance: str) -> None:
    """Set a session's title (titles are unique in a profile)."""
    with c.open_store() as store, options_named({**SESSION_ARG, "title": "TITLE"}), free_title_hint(store):
        seq = store.set_title(session_id, title, provenance)
    report("kept the existing higher-provenance title" if seq is None
               else f"titled session {session_id} (event seq {seq})")


@sessions.command("erase")
@click.argument("session_id")
@click.option("--reason", required=True, help="Why, for the audit record (who and when are recorded too).")
@json_option
@pass_ctx
@handled
def sessions_erase(c: Ctx, session_id: str, reason: str, as_json: bool) -> None:
    """Erase a session and its descendants: their content is gone from every file; the log keeps
    an audit record and still verifies."""
    with c.open_store() as store, options_named({**SESSION_ARG, "reason": "--reason"}):
        out = store.erase_session(session_id, reason)
    if as_json:
        report_json(out)
    elif out["seq"]:
        n = len(out["sessions"])
        report(f"erased {out['events']} events of {n} session{'s' if n != 1 else ''} (erase record: seq {out['seq']})")
    else:
        report("already erased: nothing left to erase")


@sessions.command("end")
@click.argument("session_id")
@click.option("--reason", default="user", show_default=True, help="Why it ended (the first reason wins).")
@pass_ctx
@handled
def sessions_end(c: Ctx, session_id: str, reason: str) -> None:
    """End a session."""
    with c.open_store() as store, options_named({**SESSION_ARG, "reason": "--reason"}):
        seq = store.end_session(session_id, reason)
    report("already ended" if seq is None else f"ended session {session_id} (event seq {seq})")
