"""The generic log: hash-chained, append-only events with one writer. Knows no sessions.

``Log`` is the protocol every backend implements; ``EventLog`` is the LMDB backend (the
default, loaded on first use), ``PostgresLog`` the PostgreSQL one (needs ``eventlog[postgres]``),
``MemoryLog`` the in-memory reference. :func:`open_log` opens either durable backend from a
path or a URL. See :mod:`eventlog.log.base`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventlog.errors import NotFoundError, ValidationError, extra_install_hint
from eventlog.log.base import Log, LogBase, VerifyResult

if TYPE_CHECKING:
    from eventlog.log.lmdb import EventLog
    from eventlog.log.memory import MemoryLog
    from eventlog.log.postgres import PostgresLog

__all__ = ["EventLog", "Log", "LogBase", "MemoryLog", "PostgresLog", "VerifyResult", "check_target", "is_log_url", "open_log"]

LOG_URL_ENV = "EVENTLOG_LOG_URL"
"""Environment variable naming the log a SessionStore (and the CLI) uses instead of the home's LMDB log."""

_LAZY = {"EventLog": "eventlog.log.lmdb", "MemoryLog": "eventlog.log.memory", "PostgresLog": "eventlog.log.postgres"}
_URL = re.compile(r"^postgres(ql)?://", re.IGNORECASE)
_KEY_VALUE = re.compile(r"^\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options)\s*=",
                        re.IGNORECASE)
"""The start of a libpq ``key=value`` connection string (not supported: a URL is)."""


def __getattr__(name: str) -> Any:
    # Backends load on first use: `import eventlog.log` stays cheap and never pulls in LMDB or psycopg.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eventlog.log' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def is_log_url(target: object) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL: a log :func:`open_log` opens on PostgreSQL."""
    return isinstance(target, str) and bool(_URL.match(target))


_USERINFO_OK = re.compile(r"[A-Za-z0-9\-._~!$&()*+,;=:%]*")
"""What a URL's user and password may hold as they are (RFC 3986's userinfo, less the quote,
which ends a URL in a message); anything else percent-encoded."""


def check_url_userinfo(url: str, field: str) -> None:
    """Refuse a ``postgresql://`` URL whose user or password holds a character that must be
    percent-encoded (``@ / ? # "`` space ...): libpq would split it elsewhere than the user
    meant, and name the password's tail in its error, where no redaction can find it. Nothing
    of the URL is echoed (:class:`ValidationError` naming ``field``)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    _check_password_param(rest, field)
    at = rest.rfind("@")
    if at < 0:
        return
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if end < at:  # an '@' past the authority: in the query (fine) or after a raw '/?#' of a password
        first = rest.find("@", 0, end)
        if first >= 0:
            at = first
        else:
            host, _, port = rest[:end].partition(":")
            if not port or port.isdigit():
                return  # host[:port] then a path or query that holds an '@'
            at = -1  # user:password with a raw '/', '?' or '#'
    if at < 0 or "@" in rest[:at] or not _USERINFO_OK.fullmatch(rest[:at]):
        raise ValidationError(field, "the URL's user or password holds a character that must be percent-encoded",
                              hint="percent-encode it: '@' as %40, '/' %2F, '?' %3F, '#' %23, ' ' %20, "
                                   "'\"' %22, \"'\" %27, '<' %3C, '>' %3E")
    if _BAD_PERCENT.search(rest[:at]):
        raise ValidationError(field, "the URL's user or password holds a '%' that is not followed by two hex digits",
                              hint=_PERCENT_HINT)


_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
"""A '%' that does not start a %XX escape: libpq refuses the URL quoting the token (a password) whole."""
_PERCENT_HINT = "write each '%' of the password itself as %25"


def _check_password_param(rest: str, field: str) -> None:
    """Refuse a ``password=`` query parameter holding a '%' that is not a %XX escape (not echoed)."""
    query = rest.partition("?")[2].partition("#")[0]
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key.strip().lower() == "password" and _BAD_PERCENT.search(value):
            raise ValidationError(field, "the URL's password parameter holds a '%' that is not followed by two hex "
                                         "digits", hint=_PERCENT_HINT)


def check_target(target: str | os.PathLike[str]) -> None:
    """:class:`ValidationError` naming ``log`` for a target :func:`open_log` refuses whatever is
    there: an empty one, a libpq key=value string, a URL of another scheme or a PostgreSQL URL
    whose user or password libpq would misread. Checked without opening anything (the adapters
    check their ``log=`` when they are made, and open it later)."""
    if not str(target).strip():
        raise ValidationError("log", "is empty: give a postgresql:// URL or a log directory")
    if isinstance(target, str) and _KEY_VALUE.match(target) and not os.path.exists(target):
        # Not echoed: it may hold a password.
        raise ValidationError("log", "is a libpq key=value connection string: eventlog takes a postgresql:// URL",
                              hint="write it as postgresql://user:password@host:port/dbname "
                                   "(percent-encode special characters in the user and password)")
    if is_log_url(target):
        check_url_userinfo(str(target), "log")
    elif isinstance(target, str) and "://" in target:
        raise ValidationError("log", f"unsupported log URL scheme in {target.split('://', 1)[0]!r}://",
                              hint="use a postgresql:// URL or the path of an LMDB log directory")


def open_log(target: str | os.PathLike[str], *, profile: str | None = None, durability: str = "sync",
             **options: Any) -> Log:
    """Open the log at ``target``: a ``postgresql://user:password@host:port/db`` URL opens
    ``profile``'s log on that server (:class:`~eventlog.log.postgres.PostgresLog`, psycopg
    imported only then); anything else is the directory of an LMDB log
    (:class:`~eventlog.log.lmdb.EventLog`). ``durability`` ("sync" | "nosync") and other
    ``options`` go to the backend's ``open``. The caller closes the log.
    """
    check_target(target)
    if is_log_url(target):
        if profile is None:
            raise ValidationError("profile", "is required to open a PostgreSQL log (one log per profile)")
        try:
            from eventlog.log.postgres import PostgresLog
        except ImportError as e:
            raise ValidationError("log", "a postgresql:// log needs psycopg 3",
                                  hint=extra_install_hint("postgres")) from e
        return PostgresLog.open(str(target), profile=profile, durability=durability, **options)
    from eventlog.log.lmdb import EventLog, generation_dir

    if not options.pop("create", True):  # as for PostgreSQL: a log that is not there is an error
        path = Path(target)
        if not (generation_dir(path) / "data.mdb").exists():
            raise NotFoundError("log", str(path))
    return EventLog.open(target, durability=durability, profile=profile, **options)
