"""How an adapter turns a framework's id (any string) into an eventlog session id.

eventlog session ids are 1-128 characters of ``[A-Za-z0-9_.:@-]``; frameworks accept any string.
The mapping is deterministic and injective:

- ``prefix + external`` when that is a valid session id and ``external`` does not look like a
  hashed id itself (``h-`` and 64 hex digits) nor start with another adapter's reserved prefix;
- otherwise ``prefix + "h-" + sha256(domain, NUL, external as UTF-8 with surrogates kept)``.

Hashed ids are reversible through the store: the adapter records the original id in the
session's ``model_config`` (``{"<domain>": {"<id_field>": original}}``) when it creates the
session. (A lone surrogate in the original is stored as U+FFFD, as every eventlog text is.)
"""
from __future__ import annotations

import hashlib
import re

from eventlog.errors import ValidationError

MAX_EXTERNAL_ID = 65536
"""Longest framework id accepted (characters); longer ids are refused with a ValidationError."""

_ID_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
_HASHED_RE = re.compile(r"h-[0-9a-f]{64}")
RESERVED_PREFIXES = ("lg:",)


def map_id(external: object, *, field: str, domain: str, prefix: str = "") -> tuple[str, bool]:
    """``(session_id, hashed)`` for the framework id ``external``; raises ValidationError(field)
    for a non-string or one longer than :data:`MAX_EXTERNAL_ID` characters."""
    if not isinstance(external, str):
        raise ValidationError(field, f"must be a string, got {type(external).__name__}")
    if len(external) > MAX_EXTERNAL_ID:
        raise ValidationError(field, f"longer than {MAX_EXTERNAL_ID} characters")
    text = str.__str__(external)
    direct = prefix + text
    reserved = not prefix and text.startswith(RESERVED_PREFIXES)
    if _ID_RE.fullmatch(direct) and not _HASHED_RE.fullmatch(text) and not reserved:
        return direct, False
    digest = hashlib.sha256(domain.encode() + b"\0" + text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{prefix}h-{digest}", True


def incarnation_id(external: str, *, domain: str, incarnation: int, prefix: str = "") -> str:
    """The session id of incarnation ``incarnation`` (>= 1) of the framework id ``external``
    (already accepted by :func:`map_id`): once the session an id mapped to is gone (erased), the
    framework id goes on in a new session, hashed under ``domain#incarnation`` (no domain holds a
    ``#`` or a NUL, so it never meets :func:`map_id`'s ids, nor another incarnation's)."""
    text = str.__str__(external)
    digest = hashlib.sha256(f"{domain}#{incarnation}".encode() + b"\0" + text.encode("utf-8", "surrogatepass"))
    return f"{prefix}h-{digest.hexdigest()}"
