"""``eventlog messages add``: append a message to a session through SessionStore."""
from __future__ import annotations

from typing import IO

import click

from eventlog.cli.common import Ctx, InputFile, handled, json_option, options_named, pass_ctx, report, report_json
from eventlog.cli.isolate import isolated


def _utf8(raw: bytes) -> str:
    """The file's text; a byte that is not UTF-8 is refused by its offset rather than stored as U+FFFD,
    which would change the message without saying so."""
    from eventlog.errors import ValidationError

    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError("--content-file", f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def _read_bounded(fp: IO[bytes]) -> bytes:
    """The file's bytes, read no further than one byte past what an event may hold: a file that
    never ends (``/dev/zero``, an endless pipe) is refused instead of filling memory."""
    from eventlog.errors import EventTooLargeError
    from eventlog.log.codec import MAX_EVENT_BYTES

    raw = fp.read(MAX_EVENT_BYTES + 1)
    if len(raw) > MAX_EVENT_BYTES:
        raise EventTooLargeError("--content-file", f"more than {MAX_EVENT_BYTES} bytes; an event is limited to "
                                                   f"{MAX_EVENT_BYTES} bytes",
                                 hint="give a smaller file (or split the text over several messages); nothing was appended")
    return raw


@click.group()
def messages() -> None:
    """Add messages to sessions."""


@messages.command("add")
@click.argument("session_id")
@click.option("--role", required=True, type=click.Choice(["system", "user", "assistant", "tool", "session_meta"]))
@click.option("--content", default=None, help="The message text.")
@click.option("--content-file", type=InputFile("rb"), default=None,
              help="Read the message text from a file ('-' for stdin).")
@click.option("--tool-name", default=None, help="Tool name (for role tool).")
@json_option
@pass_ctx
@isolated(appends=True)
@handled
def messages_add(c: Ctx, session_id: str, role: str, content: str | None, content_file: IO[bytes] | None,
                 tool_name: str | None, as_json: bool) -> None:
    """Append a message and say its id (the seq of its event; --json for scripts)."""
    if content is not None and content_file is None:
        text = content
    elif content is None and content_file is not None:
        text = _utf8(_read_bounded(content_file))
    else:
        raise click.UsageError("give exactly one of --content and --content-file")
    options = {"content": "--content-file" if content_file is not None else "--content",
               "tool_name": "--tool-name", "role": "--role", "session": "SESSION_ID"}
    with c.open_store() as store, options_named(options):
        mid = store.append_message(session_id, role, text, tool_name=tool_name)
    if as_json:
        report_json({"id": mid, "session_id": session_id})
    else:
        report(f"added message {mid} to session {session_id}")
