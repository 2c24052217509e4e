"""What every command shares: the selected home and profile, the error boundary, output helpers.

Loading this module costs click and :mod:`eventlog.profiles` only. The log backends, the session
domain, SQLite and orjson are imported inside the functions that use them, so a command's module
stays cheap to import and ``--help`` never pays for them.
"""
from __future__ import annotations

import contextlib
import functools
import io
import itertools
import logging
import os
import re
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, Iterator

import click

from eventlog import profiles
from eventlog.errors import (
    ConflictError,
    EventLogError,
    NotFoundError,
    OutcomeUnknownError,
    TitleConflictError,
    ValidationError,
    WriterBusyError,
    printable,
)

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
        if self.log_url is None and create:  # before the directories are made there
            from eventlog.log.filesystem import refuse_network

            refuse_network(self.home / "profiles" / profiles.validate_profile(self.profile) / "log")
        d = profiles.profile_dir(self.home, self.profile, create=create or self.log_url is not None)
        if self.log_url is None:
            profiles.refuse_lost_log(d)
        if not create and self.log_url is None and not (d / "log").is_dir():
            raise NotFoundError("profile", self.profile)
        return d

    def open_store(self, *, create: bool = False, **options: Any) -> SessionStore:
        """A one-shot store (no follower thread: it catches up on read instead)."""
        from eventlog.sessions.store import SessionStore

        if self.log_url is not None:
            # The server first: a profile it does not have is an error (not created by a read),
            # and an open it refuses leaves no local directory behind.
            self.open_log(create=create).close()
        self.profile_dir(create=create)
        options.setdefault("follower", False)
        if self.log_url is not None:
            return SessionStore.open(self.home, self.profile, log=self.log_url, **options)
        return SessionStore.open(self.home, self.profile, **options)

    @staticmethod
    def erased_on_import(log: Log) -> bool:
        """Asked while the profile's ``log`` is still open after an import: whether the file's
        ``log.erased`` records stubbed events the profile held whole (or an erase of the profile
        was left unfinished), so :meth:`clean_after_import` has words to take out of its files."""
        return bool(int(getattr(log, "erase_pending", lambda: 0)()) or getattr(log, "stubbed", 0))

    def clean_after_import(self) -> None:
        """Compact the LMDB log and purge the projections; on PostgreSQL, rebuild the projections
        (the server's dead rows are its administrator's, docs/POSTGRES.md)."""
        with self.open_store() as store:
            if hasattr(store.log, "compact"):
                store.compact()
            else:
                store.rebuild()

    def open_log(self, *, create: bool = False) -> Log:
        """The profile's log alone: no session domain, no projections, no SQLite."""
        if self.log_url is not None:
            from eventlog.log import open_log

            return open_log(self.log_url, profile=self.profile, create=create)
        from eventlog.log.lmdb import EventLog

        return EventLog.open(self.profile_dir(create=create) / "log", profile=self.profile)


pass_ctx = click.make_pass_decorator(Ctx)


def line_limit() -> int:
    """The longest input line (``append``'s stdin, an ``import`` file) that can still hold one
    event: an event's data is limited to ``MAX_EVENT_BYTES`` encoded, and a JSON escape
    (``\\u0041``) writes one stored byte as six."""
    from eventlog.log.codec import MAX_EVENT_BYTES

    return 6 * MAX_EVENT_BYTES + 65536


def bounded_lines(stream: IO[Any], limit: int | None = None) -> Iterator[Any]:
    """The lines of ``stream`` (text or bytes), each read no further than ``limit`` (default
    :func:`line_limit`): input that never ends a line (``/dev/zero``, an endless pipe) is refused
    naming the line instead of filling memory."""
    limit = line_limit() if limit is None else limit
    for n in itertools.count(1):
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) > limit:
            raise ValidationError(f"line {n}", f"longer than {limit} characters: no event is that long",
                                  hint="give one JSON object per line; nothing was written")
        yield line

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")

CLOSED_STDIN = "stdin is closed (the command was started with it closed: `<&-`, a supervisor)"


def need_stdin(what: str) -> None:
    """A usage error (exit 2) when the command must read stdin and the process has none: Python
    sets ``sys.stdin`` to None, and the read ended in an ``AttributeError`` traceback."""
    if sys.stdin is None:
        raise click.UsageError(f"{what}, but {CLOSED_STDIN}")


def need_stdout() -> None:
    """A usage error (exit 2), before any work, when the process has no stdout (started with it
    closed: ``>&-``). Every command reports there what it did -- a new session's id, the seqs
    appended, the export itself with ``-``: ``sessions new`` created a session and exited 0 with
    its id lost, ``export -`` ended in an ``AttributeError`` traceback."""
    if sys.stdout is None:
        raise click.UsageError("stdout is closed (the command was started with it closed: `>&-`), and the "
                               "command reports what it did there; start it with stdout open "
                               "(`>/dev/null` to discard the report)")
    if _read_only(sys.stdout):
        # `1</dev/null`: the work was done, then the report failed 'cannot use: Bad file
        # descriptor' with exit 1, which reads as nothing done (a retry made a second session)
        raise click.UsageError("stdout is open for reading only (the command was started with `1<FILE`), and "
                               "the command reports what it did there; start it with stdout open for writing "
                               "(`>/dev/null` to discard the report)")
    full = _full(sys.stdout)
    if full is not None:
        # `>/dev/full`: `sessions new` made the session, then failed 'cannot use: No space left on
        # device' with exit 1, which reads as nothing done (a retry made a second session)
        raise click.UsageError(f"stdout is {full}, and the command reports what it did there; start it with "
                               "stdout where it can be written (`>/dev/null` to discard the report)")


def _full(stream: Any) -> str | None:
    """Why ``stream`` can take no byte at all (``/dev/full``), or None. A file on a full file
    system is not judged before the work (some report no free block and are writable): when it
    refuses the report, :func:`report` says the work is done."""
    import stat

    try:
        st = os.fstat(stream.fileno())
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 7):
            return "/dev/full (every write to it fails: no space left on device)"
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass
    return None


class ReportLostError(EventLogError):
    """A write command did its work, and stdout refused the report of it (a disk that filled
    meanwhile): the error says so and carries the report, so that nothing is run twice."""


def report(text: str, brief: str | None = None) -> None:
    """Print what a write command did (a new id, the seqs appended) on stdout. When stdout refuses
    it (not a reader gone: that ends the command quietly), :class:`ReportLostError` says that the
    work is done and what the report was."""
    try:
        click.echo(text)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise ReportLostError(f"the command did its work, but stdout refused the report of it ({e.strerror or e}); "
                              f"the report: {brief if brief is not None else ' | '.join(text.splitlines())}",
                              hint="do not run the command again for this: it is done; give it a stdout it can "
                                   "write to next time") from None


def report_json(obj: Any) -> None:
    """:func:`emit_json` for a write command's report (see :func:`report`)."""
    import orjson

    report(_shown_json(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode()),
           brief=orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode())


def _read_only(stream: Any) -> bool:
    """Whether ``stream`` is a file descriptor open for reading only (False when it has none)."""
    try:
        import fcntl

        return fcntl.fcntl(stream.fileno(), fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except (ImportError, OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


class InputFile(click.File):
    """``click.File`` that refuses ``-`` as a usage error when stdin is closed (click raised a
    ``RuntimeError`` traceback while converting the value)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "-" and sys.stdin is None:
            self.fail(f"'-' reads stdin, but {CLOSED_STDIN}", param, ctx)
        return super().convert(value, param, ctx)


def fail(message: str) -> None:
    """Print ``error: <message>`` as one line on stderr and exit 1."""
    click.echo(f"error: {printable(message)}", err=True)
    sys.exit(1)


NOT_FOUND_HINTS = {
    "session": "list the sessions with `eventlog sessions list --archived --hidden` (deleted ones are gone for good)",
    "message": "list a session's messages with `eventlog sessions show SESSION --all`",
    "profile": "create it with `eventlog init`, or choose another with --profile (or --home)",
}


def rename_field(e: ConflictError, field: str) -> None:
    """Make the conflict ``e`` (its message ``"<field>: ..."``) name ``field`` instead, in place:
    its type and attributes (a title conflict's title and holder) stay as they are."""
    e.message = f"{field}: {e.message[len(e.field) + 2:]}"
    e.args = (e.message,)
    e.field = field


@contextlib.contextmanager
def options_named(names: dict[str, str]) -> Iterator[None]:
    """A ValidationError about a field the user gave as an option names the option: ``names``
    maps the event's field (``data.`` or ``messages[i].`` left off) to it (``"title": "--title"``).
    So does a plain ConflictError about such a field (a session id already taken), its hint too:
    "omit id" is the Python call's word, ``--id`` the command line's; and a title another session
    holds (``--title``, ``TITLE``), whose hint :func:`free_title_hint` words."""
    try:
        yield
    except ValidationError as e:
        field = re.sub(r"^(data|messages\[\d+\])\.", "", e.field or "")
        if field in names:
            raise type(e)(names[field], e.problem, hint=e.hint) from None
        raise
    except ConflictError as e:
        if type(e) not in (ConflictError, TitleConflictError) or e.field not in names \
                or not e.message.startswith(f"{e.field}: "):
            raise
        option = names[e.field]
        if isinstance(e, TitleConflictError):  # kept as it is (title, holder, a free title in its hint), renamed
            rename_field(e, option)
            raise
        hint = re.sub(rf"\b{re.escape(e.field)}\b", option, e.hint) if e.hint else e.hint
        raise ConflictError(option, e.message[len(e.field) + 2:], hint=hint) from None


@contextlib.contextmanager
def free_title_hint(store: SessionStore, batch_titles: Iterable[str] = ()) -> Iterator[None]:
    """A title conflict's hint names a free title (rather than a Python API). ``batch_titles``:
    the titles the refused input gives (not in the log yet), none of which the hint may name."""
    try:
        yield
    except TitleConflictError as e:
        try:
            # also_taken: the holder may be an earlier line of the same batch (not in the log yet),
            # and so may be the hint's candidates ('Twin #2' given by another line of it)
            free = store.next_title(e.title, also_taken=(e.title, *batch_titles))
        except EventLogError:
            free = f"{e.title} #2"
        e.hint = f"choose another title, e.g. {free!r}"
        raise


_UNDECODABLE = re.compile("[\udc80-\udcff]")


def _refuse_undecodable(values: dict[str, Any]) -> None:
    """A text option or argument holding bytes that are not UTF-8 (Python keeps them as lone
    surrogates) is refused naming the byte, as ``append`` refuses them on stdin: stored, they
    became U+FFFD and the text changed without a word. File paths keep any bytes."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    for param in ctx.command.params:
        value = values.get(param.name or "")
        if not isinstance(value, str) or isinstance(param.type, (click.Path, click.File)):
            continue
        bad = _UNDECODABLE.search(value)
        if bad is not None:
            from eventlog.errors import ValidationError

            name = param.opts[0] if param.opts and param.opts[0].startswith("-") else (param.name or "").upper()
            raise ValidationError(name, f"not valid UTF-8 (byte 0x{ord(bad.group(0)) - 0xDC00:02x} "
                                        f"at character {bad.start() + 1})",
                                  hint="give the text in UTF-8 (check the terminal's locale); nothing was done")


def handled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The CLI's error boundary: a library error becomes one line on stderr (its hint included;
    a "not found" gets one saying where to look, a busy writer one without the Python lock
    timeout) and exit status 1; so does an ``OSError`` of
    the command's own files (an output path that cannot be written). A closed stdout (``| head``)
    ends the command quietly with status 0."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _refuse_undecodable(kwargs)
            return fn(*args, **kwargs)
        except NotFoundError as e:
            if e.kind in NOT_FOUND_HINTS and e.hint == NotFoundError.HINTS.get(e.kind):
                e.hint = NOT_FOUND_HINTS[e.kind]  # the command-line words for it
            fail(str(e))
        except WriterBusyError as e:
            # The library's generic hint names a Python option (the lock timeout): a command has none. A
            # stopped holder's hint (kill -CONT) and PostgreSQL's (the server process to end) are kept.
            if e.hint == WriterBusyError.LOCK_TIMEOUT_HINT:
                e.hint = (f"retry once that process's write is done (a command waits for it at most "
                          f"{e.timeout:g} s)")
            fail(str(e))
        except OutcomeUnknownError as e:
            # The library's advice (append them again under these ids) needs the ids, which a
            # command-line user never saw: generated ones were printed nowhere, and running the
            # command again appends the events anew under new ids (second-round audit, helper-57).
            e.hint = (f"look the ids up before writing again (`eventlog log tail --json` shows each event's id); "
                      f"with `eventlog append`, give the events these ids and run it again: a retry then stores them "
                      f"once; event ids, in order: {' '.join(e.event_ids) or '(none)'}")
            fail(str(e))
        except EventLogError as e:
            fail(str(e))
        except BrokenPipeError:
            sys.exit(0)
        except PermissionError as e:
            from eventlog.profiles import denied

            fail(str(denied(e, "cannot use")) if e.filename else f"cannot use: {e.strerror or e}")
        except OSError as e:
            where = f" {e.filename}" if e.filename else ""
            fail(f"cannot use{where}: {e.strerror or e}")

    return wrapper


def _utf8(stream: Any) -> bool:
    return (getattr(stream, "encoding", None) or "utf-8").lower().replace("_", "-") in ("utf-8", "utf8")


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def on_terminate(ctx: click.Context) -> None:
    """SIGTERM (``kill``, a supervisor's stop, ``timeout``) ends the command as Ctrl-C does, by an
    exception in the main thread, so that what it began is undone or finished: a killed `import`
    left its new profile behind, empty. Exit status 143 as before. A SIGTERM the caller chose to
    ignore (or handle) is left so, and the default is back when the command ends (a command run
    inside another program, such as a test's CliRunner)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
        ctx.call_on_close(lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))


def setup_streams() -> None:
    """Stdout and stderr in an encoding that is not UTF-8 (a Latin-1 locale, ``PYTHONIOENCODING``):
    what they cannot show is written as backslash escapes instead of ending the command in a
    ``UnicodeEncodeError`` traceback; JSON is escaped as JSON (:func:`emit_json`)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and not _utf8(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _json_escape(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    if code > 0xFFFF:  # JSON spells it as a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _shown_json(text: str) -> str:
    """JSON text as stdout can show it: orjson writes non-ASCII only inside strings, where
    \\uXXXX means the same character, so a stdout that is not UTF-8 gets those escapes."""
    return text if _utf8(sys.stdout) else _NON_ASCII.sub(_json_escape, text)


def _echo_json(data: bytes) -> None:
    """orjson's UTF-8 as it is to a UTF-8 stdout: made a str first, the JSON of a long session
    took 4 bytes a character (one emoji in it is enough) and was encoded again, ~12x its size in
    memory for `sessions show --json` (outside audit, helper-87)."""
    if _utf8(sys.stdout) and getattr(sys.stdout, "buffer", None) is not None:
        click.echo(data)
    else:  # not UTF-8, or text with no bytes under it (io.StringIO, contextlib.redirect_stdout)
        click.echo(_shown_json(data.decode()))


def emit_json(obj: Any) -> None:
    """``obj`` as indented JSON with sorted keys (the shape every ``--json`` prints)."""
    import orjson

    _echo_json(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))


def emit_jsonl(obj: Any) -> None:
    """``obj`` as one line of JSON with sorted keys."""
    import orjson

    _echo_json(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS))


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


def output_path(name: str, option: str, c: "Ctx | None" = None, *, directory: bool = False,
                stream: bool = True) -> Path:
    """Check where a command will write ``name`` before any work: the folder must exist (nothing
    creates missing folders) and be a directory, and ``name`` must not be a directory (with
    ``directory``: must be one if it exists, e.g. a log directory), nor inside the profile's own.
    ``stream``: the command can write to stdout instead (``-``), and the hint says so.
    Raises :class:`ValidationError` naming ``option``. The write itself can still fail (a
    read-only or special file system such as /proc): :func:`handled` turns that into one line."""

    from eventlog.profiles import path_text

    path_text(name, option)
    path = Path(name).expanduser().absolute()
    folder = path.parent
    if not folder.exists():
        raise ValidationError(option, f"the folder {folder} does not exist", hint="create it first (nothing is created for you)")
    if not folder.is_dir():
        raise ValidationError(option, f"{folder} is not a folder")
    if not directory and path.is_dir():
        raise ValidationError(option, f"{path} is a folder; give a file name")
    if directory and path.exists() and not path.is_dir():
        raise ValidationError(option, f"{path} is not a folder (a log is a directory)",
                              hint="give the path of a new or existing log directory")
    if not directory and path.exists() and not path.is_file():  # a device or a FIFO: the atomic rename would replace it
        raise ValidationError(option, f"{path} is not a regular file",
                              hint="give a file name, or `-` for stdout" if stream else "give a file name")
    if c is not None:  # never over the profile's own files: the log is the one thing that must not break
        real = Path(os.path.realpath(path))
        own = [Path(os.path.realpath(c.home / "profiles" / c.profile))]
        if c.log_url is not None and "://" not in c.log_url:
            own.append(Path(os.path.realpath(c.log_url)))
        every = Path(os.path.realpath(c.home / "profiles"))
        if not directory:  # a file among any profile's files (export over another profile's live log)
            own.append(every)
        for d in own:
            if real == d or d in real.parents:
                where = "the profiles folder of the home" if d == every else "the profile's own directory"
                raise ValidationError(option, f"{path} is inside {where} {d}",
                                      hint="write it somewhere else: the profiles' files are their logs and projections")
    return path


def read_flags(store: SessionStore, health: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a read from ``store``'s projections cannot promise, for its output: ``degraded``
    and ``first_bad_seq`` when the log is damaged (the projections stop before that seq),
    ``stale`` when the projections cannot be updated now (a full disk). Empty when all is well.
    Printed as warnings on stderr (:func:`warn_flags`) and added to a read's JSON object."""
    try:
        status = store.read_status()  # before health(): the last read's own reach
        h = health if health is not None else store.health(full=False)
    except EventLogError:
        return {}
    flags: dict[str, Any] = {}
    damage = h.get("damage")
    if damage:
        from eventlog.log.damage import marker_path

        flags.update(degraded=True, first_bad_seq=damage["seq"], damage_reason=damage["reason"],
                     damage_refuses=marker_path(store.log) is not None)  # a log on a server keeps no marker
    if h.get("halt"):
        from projections.space import remedy

        flags.update(stale=True, stale_reason=h["halt"], stale_hint=remedy(str(h["halt"])))
    elif status.get("stale") and not damage:
        holder, state = status.get("lease_holder"), status.get("lease_holder_state")
        who = f"process {holder}" + (f" ({state})" if state else "") if holder else "another process"
        flags.update(stale=True, stale_reason=f"the projections are at seq {status.get('projected_seq')} of "
                                              f"{status.get('log_seq')}: {who} holds the projector lease",
                     stale_hint="resume or stop that process; `eventlog doctor` names it")
    return flags


def warn_flags(flags: dict[str, Any]) -> None:
    """One warning line on stderr per flag of :func:`read_flags`."""
    if "first_bad_seq" in flags:
        appends = ("appends are refused" if flags.get("damage_refuses", True)
                   else "appends are not refused (a log on a server keeps no damage marker)")
        click.echo(f"warning: the log is damaged at seq {flags['first_bad_seq']} ({flags['damage_reason']}): "
                   "no event from it on reaches the projections (what they held before is kept: it was "
                   f"verified when applied) and {appends} "
                   "(hint: run `eventlog doctor`)", err=True)
    if flags.get("stale"):
        click.echo(f"warning: the projections cannot be updated ({flags['stale_reason']}): recent events may be "
                   f"missing (hint: {flags.get('stale_hint', 'free some disk space')})", err=True)


def json_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The keys a read's JSON object gains from :func:`read_flags` (``degraded``,
    ``first_bad_seq``, ``stale``): none when all is well."""
    return {k: flags[k] for k in ("degraded", "first_bad_seq", "stale") if k in flags}


REPORTED = "eventlog_cli_reported"
"""A log record carrying this attribute (``extra={REPORTED: True}``) is said by the command's
own output (:func:`warn_flags`), so the CLI does not print it twice."""


class _WarningLines(logging.Handler):
    """The library's warnings, each as one ``warning: ...`` line on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, REPORTED, False):
            return
        try:
            click.echo(f"warning: {printable(record.getMessage())}", err=True)
        except Exception:  # a logging handler must never raise
            self.handleError(record)


def setup_logging() -> None:
    """Show the library's warnings (a projection rebuilt, a lock file replaced) as one line
    each, never with a traceback; idempotent."""
    root = logging.getLogger("eventlog")
    if not any(isinstance(h, _WarningLines) for h in root.handlers):
        handler = _WarningLines(logging.WARNING)
        root.addHandler(handler)
        root.propagate = False
