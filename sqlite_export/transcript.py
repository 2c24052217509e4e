"""Readable transcripts of one session: Markdown and a self-contained HTML page.

Both renderers take the read-model dicts (``SessionStore.get_session`` and
``SessionStore.get_messages``; see docs/EVENTS.md "Read models") and never raise on odd values:
a time that is not a number in range shows as ``unknown``, a field of the wrong type is left out.

* Times are ISO-8601 UTC (``2025-01-01T10:00:00Z``).
* Multimodal content is shown as its text parts (any part's ``text``, a refusal part's
  ``refusal``); an image part as ``[image]``, other non-text parts as ``[<type>]``.
* Tool calls and reasoning are folded (``<details>``); tool results too, since they are often
  long machine output. An assistant message with a ``tool_name`` and no ``tool_calls`` is one
  tool call, its content the arguments (the OpenAI Agents SDK adapter's function calls); a tool
  result without a ``tool_name`` is named after the call its ``tool_call_id`` answers.
* Messages are shown as given: pass ``include_inactive=True`` messages to show rewound ones
  (they are marked "rewound").

The HTML page is one file: inline CSS, no scripts, no external resources (a Content-Security-
Policy forbids loading any), and every value from the log is escaped.
"""
from __future__ import annotations

import html
import json
import math
import re
from datetime import datetime, timezone
from typing import Any, Iterator

from eventlog.sessions.rules import MAX_TIME, as_number

_IMAGE_TYPES = {"image", "image_url", "input_image"}


# ---------------------------------------------------------------------------------------
# Shared helpers


def iso_time(value: Any) -> str:
    """``value`` (epoch seconds) as ISO-8601 UTC, or ``"unknown"``."""
    seconds = as_number(value, 0.0, MAX_TIME)
    if seconds is None:
        return "unknown"
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    spec = "seconds" if seconds.is_integer() else "milliseconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return json.dumps(part, ensure_ascii=False) if part is not None else ""
    kind = part.get("type")
    if kind in _IMAGE_TYPES:
        return "[image]"
    # Any part that carries its words as text shows them: a reasoning summary (summary_text),
    # reasoning (reasoning_text) and a refusal are what the model said, not an attachment.
    if isinstance(part.get("text"), str):
        return str(part["text"])
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return str(part["refusal"])
    if isinstance(kind, str):
        name = part.get("name") or part.get("filename")
        if kind == "file" and isinstance(part.get("file"), dict):
            name = name or part["file"].get("filename")
        return f"[{kind}: {name}]" if isinstance(name, str) else f"[{kind}]"
    return json.dumps(part, ensure_ascii=False)


def content_text(content: Any) -> str:
    """The readable text of a message's content (text, or multimodal parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(t for t in (_part_text(p) for p in content) if t)
    return _part_text(content)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _pretty_json_text(text: str) -> str:
    """JSON text indented; a lone surrogate its escapes decode to (no UTF-8 holds one: the
    transcript could not be written) stays escaped as it was."""
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", pretty)


def tool_call_parts(call: Any) -> tuple[str, str]:
    """``(name, arguments as readable text)`` of one tool call in OpenAI, Anthropic or LangChain
    shape (``function.arguments``, ``input``, ``args``)."""
    if not isinstance(call, dict):
        return "unknown", json.dumps(call, ensure_ascii=False, indent=2)
    fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
    name = _str(fn.get("name")) or _str(call.get("name")) or "unknown"
    args = fn.get("arguments", call.get("arguments", call.get("input", call.get("args"))))
    if isinstance(args, str):
        return name, _pretty_json_text(args)
    if args is None:
        return name, ""
    return name, json.dumps(args, indent=2, ensure_ascii=False)


def _lone_call(message: dict[str, Any], role: str, tool_name: str | None) -> tuple[str, str] | None:
    """``(name, arguments)`` of an assistant message that is itself one tool call -- a tool name,
    no ``tool_calls``, the arguments as its content (how the OpenAI Agents SDK adapter stores a
    function call) -- else None."""
    calls = message.get("tool_calls")
    if role != "assistant" or tool_name is None or (isinstance(calls, list) and calls):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return tool_name, _pretty_json_text(content)
    return tool_name, "" if content is None else json.dumps(content, indent=2, ensure_ascii=False)


def call_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Tool call id -> tool name, from every call the messages make: names a tool result that
    carries only its call's id (the OpenAI Agents SDK adapter's function call outputs)."""
    names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict) and _str(call.get("id")):
                name = tool_call_parts(call)[0]
                if name != "unknown":
                    names.setdefault(call["id"], name)
        lone = _lone_call(message, _role(message), _str(message.get("tool_name")))
        if lone is not None and _str(message.get("tool_call_id")):
            names.setdefault(message["tool_call_id"], lone[0])
    return names


def _reasoning_text(message: dict[str, Any]) -> str:
    text = _str(message.get("reasoning")) or ""
    details = message.get("reasoning_details")
    if not text and isinstance(details, (list, dict)):
        items = details if isinstance(details, list) else [details]
        text = "\n\n".join(t for t in (_str(d.get("text")) or _str(d.get("summary")) or ""
                                        for d in items if isinstance(d, dict)) if t)
    return text


def _title(session: dict[str, Any]) -> str:
    return _str(session.get("title")) or f"Session {_str(session.get('id')) or 'unknown'}"


def _facts(session: dict[str, Any], messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    facts = [("Session", _str(session.get("id")) or "unknown")]
    if _str(session.get("parent_session_id")):
        facts.append(("Parent session", session["parent_session_id"]))
    facts.append(("Source", _str(session.get("source")) or "cli"))
    facts.append(("Model", _str(session.get("model")) or "unknown"))
    for key, label in (("cwd", "Working directory"), ("git_repo_root", "Repository"), ("git_branch", "Branch")):
        if _str(session.get(key)):
            facts.append((label, session[key]))
    facts.append(("Started", iso_time(session.get("started_at"))))
    if session.get("ended_at") is not None or session.get("end_reason") is not None:
        ended = iso_time(session.get("ended_at"))
        reason = _str(session.get("end_reason"))
        facts.append(("Ended", f"{ended} ({reason})" if reason else ended))
    facts.append(("Messages", str(len(messages))))
    tokens = [(k, session.get(k)) for k in ("input_tokens", "output_tokens")]
    if any(isinstance(v, int) and v for _, v in tokens):
        facts.append(("Tokens", " / ".join(f"{v if isinstance(v, int) else 0} {k.split('_')[0]}" for k, v in tokens)))
    cost = session.get("estimated_cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost):
        facts.append(("Estimated cost", f"${cost:.4f}"))
    return facts


def _role(message: dict[str, Any]) -> str:
    return _str(message.get("role")) or "unknown"


def _rewound(message: dict[str, Any]) -> bool:
    return message.get("active") is False


# ---------------------------------------------------------------------------------------
# Markdown


def _fence(text: str, lang: str = "") -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _md_fold(summary: str, body: str, lang: str = "") -> str:
    return f"<details><summary>{html.escape(summary)}</summary>\n\n{_fence(body, lang)}\n\n</details>"


def render_markdown(session: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    """A Markdown transcript of ``session`` with ``messages`` (read-model dicts), in the order given.

    Message text is Markdown already and is kept as written; tool output, tool calls and
    reasoning go into fenced blocks inside ``<details>`` folds.
    """
    return "".join(markdown_pieces(session, messages))


def markdown_pieces(session: dict[str, Any], messages: list[dict[str, Any]]) -> Iterator[str]:
    """:func:`render_markdown`'s text in pieces, to be written one by one: the transcript of a
    long session joined into one str (4 bytes a character with one emoji in it) and then
    encoded took ~13x its size in memory (outside audit, helper-87)."""
    lines = _markdown_lines(session, messages)
    last = max((n for n, line in enumerate(lines) if line.rstrip()), default=-1)
    for line in lines[:max(last, 0)]:
        yield line + "\n"
    yield (lines[last].rstrip() if last >= 0 else "") + "\n"  # the whole text right-stripped, then one newline


def _markdown_lines(session: dict[str, Any], messages: list[dict[str, Any]]) -> list[str]:
    session = session if isinstance(session, dict) else {}
    messages = [m for m in messages if isinstance(m, dict)]
    out = [f"# {html.escape(_title(session), quote=False)}", ""]
    out += [f"- **{label}:** `{value}`" if label in ("Session", "Parent session")
            else f"- **{label}:** {html.escape(value, quote=False)}" for label, value in _facts(session, messages)]
    out.append("")
    names = call_names(messages)
    for n, message in enumerate(messages):
        role = _role(message)
        heading = f"## {n + 1}. {role} · {iso_time(message.get('timestamp'))}"
        if isinstance(message.get("id"), int):
            heading += f" · message {message['id']}"
        if _rewound(message):
            heading += " · rewound"
        out += ["---", "", heading, ""]
        text = content_text(message.get("content"))
        tool_name = _str(message.get("tool_name"))
        lone = _lone_call(message, role, tool_name)
        if role == "tool":
            tool_name = tool_name or names.get(_str(message.get("tool_call_id")) or "")
            label = f"tool result: {tool_name}" if tool_name else "tool result"
            out += [_md_fold(label, text), ""]
        elif lone is not None:
            out += [_md_fold(f"tool call: {lone[0]}", lone[1], "json"), ""]
        elif text:
            out += [text, ""]
        reasoning = _reasoning_text(message)
        if reasoning:
            out += [_md_fold("reasoning", reasoning), ""]
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            name, args = tool_call_parts(call)
            out += [_md_fold(f"tool call: {name}", args, "json"), ""]
    return out


# ---------------------------------------------------------------------------------------
# HTML

_CSS = """
:root { color-scheme: light dark; --fg: #1d1f23; --muted: #5f6670; --bg: #ffffff; --card: #f5f6f8;
  --line: #d9dce1; --user: #2f6fdf; --assistant: #1f8a5b; --tool: #9a6a00; --system: #7a4fc4; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6e8eb; --muted: #a2a9b3; --bg: #16181c;
  --card: #1f2329; --line: #343a42; } }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
main { max-width: 52rem; margin: 0 auto; padding: 1.5rem 1rem 3rem; }
h1 { font-size: 1.5rem; margin: 0 0 .75rem; overflow-wrap: anywhere; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: 0 0 1.5rem;
  color: var(--muted); font-size: .9rem; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
article { background: var(--card); border: 1px solid var(--line); border-left: 4px solid var(--line);
  border-radius: 6px; padding: .6rem .9rem; margin: .75rem 0; }
article.user { border-left-color: var(--user); } article.assistant { border-left-color: var(--assistant); }
article.tool { border-left-color: var(--tool); } article.system, article.session_meta { border-left-color: var(--system); }
article.rewound { opacity: .6; border-style: dashed; }
article header { display: flex; flex-wrap: wrap; gap: .25rem .75rem; font-size: .85rem; color: var(--muted); }
article header .role { font-weight: 700; text-transform: uppercase; letter-spacing: .03em; color: var(--fg); }
.content { white-space: pre-wrap; overflow-wrap: anywhere; margin: .4rem 0 0; }
details { margin: .4rem 0 0; } summary { cursor: pointer; color: var(--muted); font-size: .9rem; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: var(--bg); border: 1px solid var(--line);
  border-radius: 4px; padding: .5rem; margin: .3rem 0 0; font: 13px/1.4 ui-monospace, Menlo, Consolas, monospace; }
.badge { border: 1px solid var(--line); border-radius: 3px; padding: 0 .3rem; }
footer { margin-top: 2rem; color: var(--muted); font-size: .8rem; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_fold(summary: str, body: str, cls: str) -> str:
    return f'<details class="{cls}"><summary>{_e(summary)}</summary><pre>{_e(body)}</pre></details>'


def render_html(session: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    """A self-contained HTML page of ``session`` with ``messages`` (read-model dicts)."""
    return "".join(html_pieces(session, messages))


def html_pieces(session: dict[str, Any], messages: list[dict[str, Any]]) -> Iterator[str]:
    """:func:`render_html`'s text in pieces, to be written one by one (see :func:`markdown_pieces`)."""
    for part in _html_parts(session, messages):
        yield part + "\n"


def _html_parts(session: dict[str, Any], messages: list[dict[str, Any]]) -> list[str]:
    session = session if isinstance(session, dict) else {}
    messages = [m for m in messages if isinstance(m, dict)]
    title = _title(session)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">",
        '<meta name="generator" content="eventlog">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body><main>",
        f"<h1>{_e(title)}</h1>",
        '<dl class="facts">',
    ]
    parts += [f"<dt>{_e(label)}</dt><dd>{_e(value)}</dd>" for label, value in _facts(session, messages)]
    parts.append("</dl>")
    names = call_names(messages)
    for message in messages:
        role = _role(message)
        stamp = iso_time(message.get("timestamp"))
        classes = ["msg", re.sub(r"[^a-z_]", "", role.lower()) or "unknown"]
        if _rewound(message):
            classes.append("rewound")
        parts.append(f'<article class="{" ".join(classes)}"><header>')
        parts.append(f'<span class="role">{_e(role)}</span>')
        time_attr = f' datetime="{_e(stamp)}"' if stamp != "unknown" else ""
        parts.append(f"<time{time_attr}>{_e(stamp)}</time>")
        if isinstance(message.get("id"), int):
            parts.append(f'<span class="id">message {message["id"]}</span>')
        if _rewound(message):
            parts.append('<span class="badge">rewound</span>')
        parts.append("</header>")
        text = content_text(message.get("content"))
        tool_name = _str(message.get("tool_name"))
        lone = _lone_call(message, role, tool_name)
        if role == "tool":
            tool_name = tool_name or names.get(_str(message.get("tool_call_id")) or "")
            parts.append(_html_fold(f"tool result: {tool_name}" if tool_name else "tool result", text, "tool-result"))
        elif lone is not None:
            parts.append(_html_fold(f"tool call: {lone[0]}", lone[1], "tool-call"))
        elif text:
            parts.append(f'<div class="content">{_e(text)}</div>')
        reasoning = _reasoning_text(message)
        if reasoning:
            parts.append(_html_fold("reasoning", reasoning, "reasoning"))
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            name, args = tool_call_parts(call)
            parts.append(_html_fold(f"tool call: {name}", args, "tool-call"))
        parts.append("</article>")
    parts.append(f"<footer>Exported by eventlog · {len(messages)} messages</footer>")
    parts.append("</main></body></html>")
    return parts


__all__ = ["render_markdown", "render_html", "markdown_pieces", "html_pieces", "iso_time", "content_text", "tool_call_parts"]
