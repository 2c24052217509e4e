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

from eventlog.errors import NotFoundError, ValidationError
from eventlog.log.base import Log, LogBase, VerifyResult

if TYPE_CHECKING:
    from eventlog.log.lmdb import EventLog
    from eventlog.log.memory import MemoryLog
    from eventlog.log.postgres import PostgresLog

__all__ = ["EventLog", "Log", "LogBase", "MemoryLog", "PostgresLog", "VerifyResult", "is_log_url", "open_log"]

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


def open_log(target: str | os.PathLike[str], *, profile: str | None = None, durability: str = "sync",
             **options: Any) -> Log:
    """Open the log at ``target``: a ``postgresql://user:password@host:port/db`` URL opens
    ``profile``'s log on that server (:class:`~eventlog.log.postgres.PostgresLog`, psycopg
    imported only then); anything else is the directory of an LMDB log
    (:class:`~eventlog.log.lmdb.EventLog`). ``durability`` ("sync" | "nosync") and other
    ``options`` go to the backend's ``open``. The caller closes the log.
    """
    if not str(target).strip():
        raise ValidationError("log", "is empty: give a postgresql:// URL or a log directory")
    if isinstance(target, str) and _KEY_VALUE.match(target) and not os.path.exists(target):
        # Not echoed: it may hold a password.
        raise ValidationError("log", "is a libpq key=value connection string: eventlog takes a postgresql:// URL",
                              hint="write it as postgresql://user:password@host:port/dbname "
                                   "(percent-encode special characters in the user and password)")
    if is_log_url(target):
        userinfo = str(target).split("://", 1)[1].partition("?")[0]
        if "@" in userinfo[:max(0, userinfo.rfind("@"))]:
            # libpq would take what follows the first '@' for the host, and name it (the
            # password's tail) in its error.
            raise ValidationError("log", "the URL's user or password holds a raw '@'",
                                  hint="percent-encode it as %40 (and '/', ':', '?', '#' likewise)")
        if profile is None:
            raise ValidationError("profile", "is required to open a PostgreSQL log (one log per profile)")
        try:
            from eventlog.log.postgres import PostgresLog
        except ImportError as e:
            raise ValidationError("log", "a postgresql:// log needs psycopg 3",
                                  hint="pip install 'eventlog[postgres]'") from e
        return PostgresLog.open(str(target), profile=profile, durability=durability, **options)
    if isinstance(target, str) and "://" in target:
        raise ValidationError("log", f"unsupported log URL scheme in {target.split('://', 1)[0]!r}://",
                              hint="use a postgresql:// URL or the path of an LMDB log directory")
    from eventlog.log.lmdb import EventLog, generation_dir

    if not options.pop("create", True):  # as for PostgreSQL: a log that is not there is an error
        path = Path(target)
        if not (generation_dir(path) / "data.mdb").exists():
            raise NotFoundError("log", str(path))
    return EventLog.open(target, durability=durability, profile=profile, **options)
