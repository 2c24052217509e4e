"""What every command shares: the selected home and profile, the error boundary, output helpers.

Loading this module costs click and :mod:`eventlog.profiles` only. The log backends, the session
domain, SQLite and orjson are imported inside the functions that use them, so a command's module
stays cheap to import and ``--help`` never pays for them.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import click

from eventlog import profiles
from eventlog.errors import EventLogError, NotFoundError, printable

if TYPE_CHECKING:
    from eventlog.log import Log
    from eventlog.sessions.store import SessionStore


class Ctx:
    """What the global options select: a home, a profile, and where its log is (``log_url``:
    a ``postgresql://`` URL; None: the LMDB log in the profile's directory)."""

    def __init__(self, home: str | None, profile: str, log_url: str | None = None) -> None:
        self.home = profiles.resolve_home(home)
        self.profile = profile
        self.log_url = log_url

    def profile_dir(self, *, create: bool) -> Path:
        """The profile's directory; :class:`NotFoundError` unless it has a log or ``create``.
        With a log URL it holds only this host's projections, and is made when missing."""
        d = profiles.profile_dir(self.home, self.profile, create=create or self.log_url is not None)
        if not create and self.log_url is None and not (d / "log").is_dir():
            raise NotFoundError("profile", self.profile)
        return d

    def open_store(self, *, create: bool = False, **options: Any) -> SessionStore:
        """A one-shot store (no follower thread: it catches up on read instead)."""
        from eventlog.sessions.store import SessionStore

        self.profile_dir(create=create)
        options.setdefault("follower", False)
        if self.log_url is not None:
            if not create:
                self.open_log().close()  # a profile the server does not have is an error, not created
            return SessionStore.open(self.home, self.profile, log=self.log_url, **options)
        return SessionStore.open(self.home, self.profile, **options)

    def open_log(self, *, create: bool = False) -> Log:
        """The profile's log alone: no session domain, no projections, no SQLite."""
        if self.log_url is not None:
            from eventlog.log import open_log

            return open_log(self.log_url, profile=self.profile, create=create)
        from eventlog.log.lmdb import EventLog

        return EventLog.open(self.profile_dir(create=create) / "log", profile=self.profile)


pass_ctx = click.make_pass_decorator(Ctx)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def fail(message: str) -> None:
    """Print ``error: <message>`` as one line on stderr and exit 1."""
    click.echo(f"error: {printable(message)}", err=True)
    sys.exit(1)


def handled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The CLI's error boundary: a library error becomes one line on stderr (its hint included)
    and exit status 1; a closed stdout (``| head``) ends the command quietly with status 0."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EventLogError as e:
            fail(str(e))
        except BrokenPipeError:
            sys.exit(0)

    return wrapper


def emit_json(obj: Any) -> None:
    """``obj`` as indented JSON with sorted keys (the shape every ``--json`` prints)."""
    import orjson

    click.echo(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode())


def emit_jsonl(obj: Any) -> None:
    """``obj`` as one line of JSON with sorted keys."""
    import orjson

    click.echo(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode())


def iso(t: Any) -> str:
    """A timestamp in seconds as UTC ``YYYY-MM-DD HH:MM:SS``; ``unknown`` for odd stored values."""
    from datetime import datetime, timezone

    from eventlog.sessions.rules import MAX_TIME

    if not isinstance(t, (int, float)) or not 0 <= t <= MAX_TIME:
        return "unknown"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@contextlib.contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A click progress bar on a terminal (stderr), a silent stand-in otherwise.

    Yields ``update(done, total)``; the bar appears on the first update.
    """
    if not sys.stderr.isatty():
        yield lambda done, total: None
        return
    bars: list[Any] = []
    seen = [0]

    def update(done: int, total: int) -> None:
        if not bars:
            bars.append(click.progressbar(length=max(total, 1), label=label, file=sys.stderr))
            bars[0].__enter__()
        bars[0].update(done - seen[0])
        seen[0] = done

    try:
        yield update
    finally:
        if bars:
            bars[0].__exit__(None, None, None)
