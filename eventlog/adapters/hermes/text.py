"""Hermes' text rules: title sanitising, surrogate scrubbing, the structured-content sentinel,
FTS5 query sanitising and CJK detection. Pure functions, written from the behaviour Hermes
0.19.0 documents and tests.

Two rules are Hermes' agent policy rather than storage, and are taken from the installed Hermes
when it is importable (the facade runs inside Hermes): the memory-context scrub applied to
replayed user/assistant text (``agent.memory_manager.sanitize_context``) and the alternation
repair for live replay (``agent.agent_runtime_helpers.repair_message_sequence``).
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Callable

log = logging.getLogger("eventlog.adapters.hermes")

MAX_TITLE_LENGTH = 100
CONTENT_JSON_PREFIX = "\x00json:"
MAX_FTS5_QUERY_CHARS = 2048

_SURROGATES = re.compile("[\ud800-\udfff]")
_ASCII_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_INVISIBLE = re.compile("[\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufffc\ufff9-\ufffb]")
_SPACES = re.compile(r"\s+")


def scrub(text: str) -> str:
    """Each lone surrogate code point replaced by U+FFFD (SQLite cannot store them)."""
    return _SURROGATES.sub("\ufffd", text) if _SURROGATES.search(text) else text


def scrub_if_text(value: Any) -> Any:
    return scrub(value) if isinstance(value, str) else value


def sanitize_title(title: Any) -> str | None:
    """Hermes' title rule: surrogates scrubbed, control and invisible formatting characters
    removed, whitespace runs collapsed, trimmed; empty means no title (None); longer than 100
    characters raises ValueError."""
    if not title:
        return None
    cleaned = _INVISIBLE.sub("", _ASCII_CONTROLS.sub("", scrub(title)))
    cleaned = _SPACES.sub(" ", cleaned).strip()
    if not cleaned:
        return None
    if len(cleaned) > MAX_TITLE_LENGTH:
        raise ValueError(f"Title too long ({len(cleaned)} chars, max {MAX_TITLE_LENGTH})")
    return cleaned


def encode_content(content: Any) -> Any:
    """Message content as Hermes stores it: text scrubbed; None, bytes and numbers as they are;
    anything else as ``"\\x00json:" + json.dumps(...)``, or its ``str()`` when not JSON."""
    if isinstance(content, str):
        return scrub(content)
    if content is None or isinstance(content, (bytes, int, float)):
        return content
    try:
        return CONTENT_JSON_PREFIX + json.dumps(content)
    except (TypeError, ValueError):
        return scrub(str(content))


def decode_content(content: Any) -> Any:
    if isinstance(content, str) and content.startswith(CONTENT_JSON_PREFIX):
        try:
            return json.loads(content[len(CONTENT_JSON_PREFIX):])
        except (json.JSONDecodeError, TypeError):
            log.warning("Failed to decode JSON-encoded message content; returning raw string")
    return content


def json_text(value: Any) -> str | None:
    """``json.dumps(value)`` for a truthy value, else None (Hermes' encoding of tool calls,
    reasoning details and Codex items)."""
    return json.dumps(value) if value else None


def content_preview(decoded: Any) -> str:
    """Text of decoded content for previews: text parts of multimodal content joined."""
    if isinstance(decoded, list):
        parts = [p.get("text", "") for p in decoded if isinstance(p, dict) and p.get("type") == "text"]
        return " ".join(t for t in parts if t).strip() or "[multimodal content]"
    return decoded if isinstance(decoded, str) else ""


def like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# ---- FTS5 queries ----------------------------------------------------------------------------

_FTS_SPECIAL = re.compile(r'[+{}():"^]')
_STARS = re.compile(r"\*+")
_LEADING_STAR = re.compile(r"(^|\s)\*")
_OP_AT_START = re.compile(r"(?i)^(AND|OR|NOT)\b\s*")
_OP_AT_END = re.compile(r"(?i)\s+(AND|OR|NOT)\s*$")
_COMPOUND = re.compile(r"\b(\w+(?:[._-]\w+)+)\b")


def sanitize_fts5_query(query: str) -> str:
    """A user query made safe for FTS5 MATCH, as Hermes makes it: capped at 2048 characters;
    balanced ``"phrases"`` kept verbatim; an unbalanced quote becomes a space; FTS operators
    characters (including the column filter ``:``) become spaces; ``*`` runs collapse and a
    leading ``*`` goes; a boolean operator at either end goes; dotted/hyphenated/underscored
    compounds are quoted as phrases."""
    query = query[:MAX_FTS5_QUERY_CHARS]
    phrases: list[str] = []
    out: list[str] = []
    i = 0
    while i < len(query):
        if query[i] != '"':
            out.append(query[i])
            i += 1
            continue
        close = query.find('"', i + 1)
        if close < 0:
            out.append(" ")
            i += 1
            continue
        phrases.append(query[i:close + 1])
        out.append(f"\x00Q{len(phrases) - 1}\x00")
        i = close + 1
    text = _FTS_SPECIAL.sub(" ", "".join(out))
    text = _LEADING_STAR.sub(r"\1", _STARS.sub("*", text))
    text = _OP_AT_START.sub("", text.strip())
    text = _OP_AT_END.sub("", text.strip())
    text = _COMPOUND.sub(r'"\1"', text)
    for n, phrase in enumerate(phrases):
        text = text.replace(f"\x00Q{n}\x00", phrase)
    return text.strip()


_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x3000, 0x303F),
               (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7AF))


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def count_cjk(text: str) -> int:
    return sum(1 for ch in text if is_cjk(ch))


def contains_cjk(text: str) -> bool:
    return any(is_cjk(ch) for ch in text)


# ---- Hermes' agent policy, from the installed Hermes ----------------------------------------

def _identity(text: str) -> str:
    return text


def context_scrubber() -> Callable[[str], str]:
    try:
        from agent.memory_manager import sanitize_context
    except ImportError:  # Hermes not installed: nothing to scrub for
        return _identity
    return sanitize_context  # type: ignore[no-any-return]


def alternation_repairer() -> Callable[[Any, list[dict[str, Any]]], int] | None:
    try:
        from agent.agent_runtime_helpers import repair_message_sequence
    except ImportError:
        return None
    return repair_message_sequence  # type: ignore[no-any-return]


REVIEW_HARNESS_PREFIXES = (
    "Review the conversation above and update the skill library",
    "Review the conversation above and consider saving to memory",
)


def _is_review_harness(msg: dict[str, Any]) -> bool:
    content = msg.get("content")
    return (msg.get("role") in ("user", "system") and isinstance(content, str)
            and content.lstrip().startswith(REVIEW_HARNESS_PREFIXES))


def drop_review_harness(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the prompts a forked background review once wrote into real sessions, and the
    assistant reply right after each (replaying them would make the agent a curator)."""
    out: list[dict[str, Any]] = []
    skip_reply = False
    for msg in messages:
        if _is_review_harness(msg):
            skip_reply = True
            continue
        if skip_reply:
            skip_reply = False
            if msg.get("role") == "assistant":
                continue
        out.append(msg)
    return out
