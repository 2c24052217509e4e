"""The one exception hierarchy of eventlog.

Every error a caller can meet derives from :class:`EventLogError`. Errors carry an
optional ``hint`` telling the user how to recover; ``str(err)`` includes it.
Driver errors (LMDB, SQLite) are converted at one boundary each, with the cause chained.
"""
from __future__ import annotations

from typing import Any


def printable(text: str) -> str:
    """``text`` with control and other unprintable characters escaped (one line, always)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


FIELD_SHOWN = 160
"""The most characters of a field's path a message shows (``.field`` keeps it whole): a path
64 levels deep, or through a 10 KB key, made a one-line error of thousands of characters."""


def shown_field(field: str) -> str:
    """``field`` as a message shows it: printable, its middle cut when longer than FIELD_SHOWN."""
    text = printable(field)
    if len(text) <= FIELD_SHOWN:
        return text
    half = FIELD_SHOWN // 2
    return f"{text[:half]}…({len(text) - 2 * half} characters)…{text[-half:]}"


def extra_install_hint(extra: str) -> str:
    """How to install eventlog's optional extra ``extra``, said so that copying it works.

    eventlog is installed from its source tree: the name ``eventlog`` on PyPI belongs to another
    project, so ``pip install 'eventlog[postgres]'`` installs that project (and Django) instead.
    The hint names the extra's own requirements as this installation's metadata lists them, or,
    without metadata (a source tree on the path, never installed), the editable install of the
    folder this eventlog is imported from (a placeholder, ``<eventlog source folder>``, only when
    that folder is not a source tree: copied, the placeholder failed)."""
    import shlex
    from pathlib import Path

    try:
        from importlib.metadata import requires

        listed = requires("eventlog") or []
    except Exception:  # no metadata (a bare source tree on sys.path)
        listed = []
    wanted = [r.split(";", 1)[0].strip() for r in listed
              if ";" in r and r.split(";", 1)[1].replace("'", '"').replace(" ", "") == f'extra=="{extra}"']
    if wanted:
        return f"pip install {' '.join(shlex.quote(w) for w in wanted)} (eventlog's [{extra}] extra)"
    source = Path(__file__).resolve().parent.parent
    if (source / "pyproject.toml").is_file():
        return f"pip install -e {shlex.quote(f'{source}[{extra}]')}"
    return f"pip install -e '<eventlog source folder>[{extra}]'"


class EventLogError(Exception):
    """Root of every eventlog error."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} (hint: {self.hint})"
        return self.message


class ValidationError(EventLogError, ValueError):
    """Input was rejected before anything was appended. ``field`` names the offending field."""

    hint: str | None = "correct the field named and call again: nothing was appended"

    def __init__(self, field: str, problem: str, *, hint: str | None = None) -> None:
        super().__init__(f"invalid {shown_field(field)}: {problem}", hint=hint)
        self.field = field
        self.problem = problem


class ProfileNameError(ValidationError):
    """A profile name that does not match ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``."""


class EventTooLargeError(ValidationError):
    """An encoded event exceeds the documented size limit."""


class ConcurrencyError(EventLogError):
    """``expected_version`` did not match the stream's current version; nothing was appended."""

    def __init__(self, stream: str | None, expected: int, actual: int) -> None:
        super().__init__(
            f"stream {stream!r} is at version {actual}, caller expected {expected}",
            hint="re-read the session and retry",
        )
        self.stream = stream
        self.expected = expected
        self.actual = actual


class HeadMovedError(ConcurrencyError):
    """``expected_head`` (an append conditional on the log's last seq) did not match; nothing was
    appended."""

    def __init__(self, expected: int, actual: int) -> None:
        EventLogError.__init__(
            self, f"the log ends at seq {actual}, caller expected {expected}",
            hint="bring what the events were derived from up to the log, and retry",
        )
        self.stream = None
        self.expected = expected
        self.actual = actual


class NotFoundError(EventLogError, LookupError):
    """An operation named a session or message that does not exist (or was deleted)."""

    HINTS = {
        "session": "list the live sessions with list_sessions() (`eventlog sessions list`); a deleted session is gone",
        "message": "a message's id is the seq of its event: list a session's messages with get_messages()",
        "profile": "create it by opening a store on it (`eventlog init`), or choose another profile or home",
        "log": "check the path or URL given for the log; `eventlog init` creates a profile's log",
        "thread": ("the thread was erased (delete_thread with erase_deleted=True, `eventlog sessions erase`, "
                   "retention) and its id stays taken: go on under a new thread_id; nothing was written"),
    }

    def __init__(self, kind: str, ident: Any) -> None:
        super().__init__(f"{kind} {ident!r} not found",
                         hint=self.HINTS.get(kind, f"check the {kind} named: nothing was changed"))
        self.kind = kind
        self.ident = ident


class ConflictError(EventLogError):
    """A domain rule refused the operation (e.g. a title another session holds)."""

    hint: str | None = "re-read the session: another write got there first; nothing was appended"

    def __init__(self, field: str, problem: str, *, hint: str | None = None) -> None:
        super().__init__(f"{field}: {problem}", hint=hint)
        self.field = field


class EarlierProcessError(ConflictError):
    """A process of an earlier eventlog release has the log open and the operation (a compaction
    of a log still in the first release's layout) would lose what it writes; nothing changed."""

    hint: str | None = "stop the earlier release's processes (or let them finish), then retry; nothing was changed"


class TitleConflictError(ConflictError):
    """The title is already held by another session of this profile."""

    def __init__(self, title: str, holder: str) -> None:
        super().__init__(
            "title",
            f"{title!r} is already used by session {holder!r}",
            hint="choose another title, e.g. with SessionStore.next_title()",
        )
        self.title = title
        self.holder = holder


class IntegrityError(EventLogError):
    """Stored data does not match what it must be (broken chain, id reused with other content)."""

    hint: str | None = "`eventlog log verify` names the first bad seq; docs/RELIABILITY.md says how to recover"


class DuplicateEventError(IntegrityError):
    """An event id already in the log was given again with different content."""

    def __init__(self, event_id: str, seq: int) -> None:
        super().__init__(
            f"event id {event_id!r} already stored at seq {seq} with different content",
            hint="event ids are idempotency keys: use a fresh id for a new event",
        )
        self.event_id = event_id
        self.seq = seq


class StorageError(EventLogError):
    """The storage layer failed (LMDB, SQLite, file system)."""

    hint: str | None = "check the profile directory's disk and permissions; `eventlog doctor` says what is wrong"


class PermissionDeniedError(StorageError):
    """A file or folder of the profile cannot be used by this user: another user's (a command run
    with sudo, a restored backup, a copied profile) or a mode that keeps its owner out. ``path``
    is the one that refuses; the message says whose it is and the hint how to give it back
    (``chown``/``chmod``: nothing needs deleting). Nothing was written."""

    def __init__(self, message: str, *, hint: str | None = None, path: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class ProfileGoneError(StorageError):
    """The profile this log handle was opened on was removed from the server (or removed and
    created anew) while the handle was open; nothing was read or written through it."""

    hint: str | None = ("close this log (or store) and open the profile again; if it was removed by mistake, "
                        "restore its log from a backup or an export")


class OutcomeUnknownError(StorageError):
    """A write's COMMIT was sent, its connection was lost before the answer, and the server could
    not be reached again within the log's reconnect timeout to find out: the events may or may
    not be stored. ``event_ids``: the ids of the call's events (generated ones included), in order."""

    hint: str | None = ("append the same events again with these ids once the server is back (event_ids): ids are "
                        "idempotency keys, so a retry returns the original seqs if they were stored and appends "
                        "them once if not; do not append them under new ids")

    def __init__(self, message: str, event_ids: Any = (), *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.event_ids: list[str] = [str(i) for i in event_ids]


class DiskFullError(StorageError):
    """The disk (or the LMDB map) has no room; nothing of the failed batch was written."""

    hint: str | None = "free disk space, then retry: nothing of the failed write was kept"


class WriterBusyError(StorageError):
    """Another process held the log's writer lock longer than the lock timeout (or ``lock``, a
    lock a write needs besides it, such as the rules lock); nothing was written."""

    LOCK_TIMEOUT_HINT = "retry once that process's write is done; raise the lock timeout for long waits"
    """The hint when nothing more is known of the holder (it names a Python option: the CLI
    words it its own way). A log that knows more (PostgreSQL: the server process holding the
    lock, and how to end it) sets its own hint."""

    def __init__(self, path: Any, pid: int | None, timeout: float, *, lock: str | None = None,
                 again: bool = False) -> None:
        who = f"process {pid}" if pid is not None else "another process"
        state = process_state(pid)
        held = f"the log at {path} is being written by" if lock is None else f"{lock} {path} is held by"
        gave_up = (f"gave up at once (an earlier write of this process waited {timeout:g} s for it, and it has "
                   "not moved since)" if again else f"gave up after {timeout:g} s")
        super().__init__(
            f"{held} {who}{f' ({state})' if state else ''}; {gave_up} and wrote nothing",
            hint=(f"resume or end that process (it is stopped: `kill -CONT {pid}`)" if state == "stopped" and pid
                  else self.LOCK_TIMEOUT_HINT),
        )
        self.pid = pid
        self.timeout = timeout
        self.again = again
        """Given up at once: this process had already waited ``timeout`` for the same stopped holder."""
        self.stopped = state == "stopped" and bool(pid)
        """The holder is a stopped process (the hint then says how to resume it)."""


def process_state(pid: int | None) -> str | None:
    """``"stopped"``, ``"running"`` or None (unknown) for a pid, from /proc (Linux)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return "stopped" if state in ("T", "t") else "running"


class ForkedEnvironmentError(StorageError):
    """An LMDB environment was used in a child process after ``fork()``."""

    def __init__(self, path: object = None) -> None:
        hint = ("open logs in the child only: fork before opening, or start the child with "
                "multiprocessing's 'spawn' or 'forkserver' method (py-lmdb cannot open an "
                "environment again in a process that inherited it open)")
        if path is None:
            super().__init__("this EventLog was opened before fork() and cannot be used in the child process",
                             hint=hint)
        else:
            super().__init__(f"the log at {path} was open in the parent when this process was forked, "
                             "and cannot be opened again in it", hint=hint)


class ClosedError(StorageError):
    """The log or store was used after close()."""

    hint: str | None = "open a new store (or log) for further calls"


class LeaseError(StorageError):
    """A flock lease could not be taken or its lock file is unusable."""


class ProjectionError(StorageError):
    """A projection (state.db or the FTS index) could not be read or rebuilt."""

    hint: str | None = "`eventlog rebuild` rebuilds the projections from the log (the log is not touched)"


class SearchDegradedError(ProjectionError):
    """The FTS index is unusable; search falls back to a scan and this is reported."""
