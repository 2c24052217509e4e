"""``eventlog messages add``: append a message to a session through SessionStore."""
from __future__ import annotations

from typing import IO

import click

from eventlog.cli.common import Ctx, emit_json, handled, json_option, options_named, pass_ctx


@click.group()
def messages() -> None:
    """Add messages to sessions."""


@messages.command("add")
@click.argument("session_id")
@click.option("--role", required=True, type=click.Choice(["system", "user", "assistant", "tool", "session_meta"]))
@click.option("--content", default=None, help="The message text.")
@click.option("--content-file", type=click.File("r", encoding="utf-8", errors="replace"), default=None,
              help="Read the message text from a file ('-' for stdin).")
@click.option("--tool-name", default=None, help="Tool name (for role tool).")
@json_option
@pass_ctx
@handled
def messages_add(c: Ctx, session_id: str, role: str, content: str | None, content_file: IO[str] | None,
                 tool_name: str | None, as_json: bool) -> None:
    """Append a message and say its id (the seq of its event; --json for scripts)."""
    if content is not None and content_file is None:
        text = content
    elif content is None and content_file is not None:
        text = content_file.read()
    else:
        raise click.UsageError("give exactly one of --content and --content-file")
    options = {"content": "--content-file" if content_file is not None else "--content",
               "tool_name": "--tool-name", "role": "--role"}
    with c.open_store() as store, options_named(options):
        mid = store.append_message(session_id, role, text, tool_name=tool_name)
    if as_json:
        emit_json({"id": mid, "session_id": session_id})
    else:
        click.echo(f"added message {mid} to session {session_id}")
