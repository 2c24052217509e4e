"""Migration in: an existing Hermes Agent ``state.db`` becomes events of a profile's log.

:func:`import_hermes` reads the source strictly read-only, turns every session and message it
can make sense of into events, and appends them through the profile's log. It never aborts the
whole import because of one damaged row: a bad value is coerced or dropped, a row that cannot be
imported is skipped, and each such decision is reported as a warning that names the source
session and, for messages, the source row id.

Reading the source (it is never written, and its bytes and mtime stay unchanged):

* a source with a ``-wal``, ``-shm`` or ``-journal`` beside it may be open in Hermes right now
  (or was not checkpointed): it is opened with ``mode=ro`` and copied with SQLite's backup API
  into a private temporary snapshot, which is then read. The source is held only for the copy.
  (If a ``-wal`` has no ``-shm`` the file cannot be live; when SQLite cannot open it read-only,
  the database and its ``-wal`` are copied as files into the temporary directory instead.)
* a source without sidecar files is probed with ``mode=ro`` and an exclusive (shared, for a
  read-only handle) lock: a rollback-journal database opens that way and is read in place with
  ``mode=ro``. A WAL-mode database fails the probe, because SQLite would have to create the
  ``-wal``/``-shm`` beside it; with no ``-wal`` present nobody has it open and its content is
  entirely in the main file, so it is read with ``immutable=1`` (no sidecars are created).

Mapping (Hermes column -> event):

* ``sessions`` rows, parents before children and otherwise by ``started_at`` then id ->
  ``session.created`` (source, model, model_config, cwd, git_repo_root, git_branch,
  parent_session_id, user_id, chat_id, chat_type, thread_id, title, title_source, started_at);
  ``tool_names`` -> ``session.meta_updated``; ``archived``/``pinned``/``hidden`` ->
  ``session.archived``/``session.pinned``/``session.hidden`` on the lineage root (eventlog flags
  whole lineages; a lineage whose members disagree is flagged as a whole, with a warning);
  ``ended_at``/``end_reason`` -> ``session.ended`` (reason ``"unknown"`` when only the time is
  known); token and cost totals -> one ``usage.recorded`` with task ``"hermes-import"`` (provider
  = ``billing_provider``), only when some total is non-zero or a cost is known.
* ``messages`` rows in id order -> ``message.appended``. Content stored with Hermes' JSON
  sentinel (``"\\x00json:"`` / ``"\\x01json:"``) or as JSON text of multimodal parts is decoded
  into the list/object once. Rows that are neither active nor compacted (Hermes' undo/rewind)
  are imported and then hidden with ``messages.rewound``; compacted rows (summarized by
  compression, still shown by Hermes) stay visible.
* Orphan messages (their session is not in the source) are skipped with one warning per missing
  session listing the rows; they are not attached to a synthetic session.

Ids: a source session id that fits ``[A-Za-z0-9_.:@-]{1,128}`` is kept; any other becomes
``h-<sha1 prefix>`` (deterministic, with a warning). A source id already used in the profile by
a session this importer did not create becomes ``h-<sha1 of "hermes:" + id>`` (warning). Event
ids are derived from the source (``hermes:<session>:created``, ``hermes:<session>:msg:<row id>``
...), so running the import again appends nothing new (``already_present`` counts what was
found), an interrupted import resumes where it stopped, and importing a later copy of the same
state.db appends only what is new. A row that changed since a previous import keeps its first
imported version (warning).

Titles: a title another session already holds (in the profile, or earlier in this import) gets
:func:`eventlog.sessions.events.next_title` treatment (``Title #2``...), with a warning. Hermes'
``title_source`` maps ``derived``/``llm``/``user`` as is, ``branch``/``branch_fallback`` to
``derived``, a missing one to ``user`` and anything else to ``llm``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sqlite3
import tempfile
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from eventlog.errors import DuplicateEventError, EventLogError, ValidationError
from eventlog.log import Log
from eventlog.sessions import events as ev
from eventlog.sessions import rules
from sqlite_export.errors import converted, not_a_database

BATCH = 1000
MESSAGE_CHUNK = 2000
MAX_WARNINGS = 1000
IMPORT_TASK = "hermes-import"
Progress = Callable[[int, int], None]

_CONTENT_PREFIXES = ("\x00json:", "\x01json:")
_TITLE_SOURCES = {"derived": "derived", "llm": "llm", "user": "user",
                  "branch": "derived", "branch_fallback": "derived"}
_SESSION_COLUMNS = (
    "id", "source", "model", "model_config", "title", "title_source", "started_at", "ended_at",
    "end_reason", "parent_session_id", "archived", "pinned", "hidden", "cwd", "git_repo_root",
    "git_branch", "user_id", "chat_id", "chat_type", "thread_id", "tool_names", "input_tokens",
    "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
    "billing_provider", "estimated_cost_usd", "actual_cost_usd",
)
_MESSAGE_COLUMNS = (
    "id", "session_id", "role", "content", "tool_call_id", "tool_calls", "tool_name", "timestamp",
    "token_count", "finish_reason", "reasoning", "reasoning_content", "reasoning_details",
    "active", "compacted", "display_kind", "display_metadata",
)
# Fields given up first when an event would exceed the size limit (content is truncated last).
_SHEDDABLE = ("reasoning_details", "reasoning", "display_metadata", "tool_calls", "model_config")


@dataclass
class ImportReport:
    """What an import did.

    ``sessions``/``messages``/``usage``: new ``session.created``/``message.appended``/
    ``usage.recorded`` events appended; ``events``: every new event (flags, ends, rewinds
    included); ``already_present``: events a previous import had already stored; ``skipped``:
    source rows (and changed rows) not imported; ``warnings``: the first 1000 warnings,
    ``warning_count``: all of them.
    """

    sessions: int = 0
    messages: int = 0
    usage: int = 0
    skipped: int = 0
    warnings: list[str] = field(default_factory=list)
    already_present: int = 0
    events: int = 0
    warning_count: int = 0

    def warn(self, text: str) -> None:
        self.warning_count += 1
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(text)
        elif len(self.warnings) == MAX_WARNINGS:
            self.warnings.append("... further warnings left out (see warning_count)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------
# Reading the source read-only


def _uri(path: Path, **params: str) -> str:
    from urllib.parse import quote

    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"file:{quote(str(path.resolve()))}?{query}"


def _connect(uri: str) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")  # bad UTF-8 never aborts a read
    return conn


def _backup(src: sqlite3.Connection, dest: Path) -> sqlite3.Connection:
    out = _connect(_uri(dest, mode="rwc"))
    src.backup(out)
    return out


def _open_source(path: Path, tmp: Path, report: ImportReport) -> sqlite3.Connection:
    """A read-only view of the source (see the module docstring for the strategy)."""
    sidecars = [s for s in ("-wal", "-shm", "-journal") if Path(f"{path}{s}").exists()]
    if sidecars:
        try:
            with closing(_connect(_uri(path, mode="ro"))) as src:
                return _backup(src, tmp / "snapshot.db")
        except sqlite3.Error as e:
            wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
            if not (wal.exists() and not shm.exists()):
                raise  # import_hermes converts it
            # No -shm: no process has this WAL database open, so copying the files is safe.
            report.warn(f"source: {wal.name} without {shm.name} could not be opened read-only "
                        f"({e}); read a private copy of the database and its WAL instead")
            shutil.copyfile(path, tmp / "copy.db")
            shutil.copyfile(wal, tmp / "copy.db-wal")
            return _connect(_uri(tmp / "copy.db", mode="rw"))
    try:
        with closing(_connect(_uri(path, mode="ro"))) as probe:
            probe.execute("PRAGMA locking_mode=EXCLUSIVE")
            probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        if not_a_database(e):
            raise  # import_hermes converts it
        return _connect(_uri(path, mode="ro", immutable="1"))  # WAL mode, nobody has it open
    return _connect(_uri(path, mode="ro"))


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


# ---------------------------------------------------------------------------------------
# Value coercion: (value, problem) pairs; problem is None when nothing had to be changed


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return v if isinstance(v, str) else str(v)


def _time(v: Any, name: str) -> tuple[float | None, str | None]:
    if v is None:
        return None, None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if math.isfinite(v) and 0 <= v <= rules.MAX_TIME:
            return float(v), None
        return None, f"{name} {v!r} is out of range; dropped (the import time is used)"
    text = _text(v) or ""
    shown = text[:40]
    try:
        number = float(text)
    except ValueError:
        try:
            return ev.parse_time(text, name), f"{name} stored as TEXT {shown!r}; read as ISO-8601 (UTC when no offset)"
        except ValidationError:
            return None, f"{name} stored as TEXT {shown!r} is not a time; dropped (the import time is used)"
    if math.isfinite(number) and 0 <= number <= rules.MAX_TIME:
        return number, f"{name} stored as TEXT {shown!r}; read as epoch seconds"
    return None, f"{name} {shown!r} is out of range; dropped (the import time is used)"


def _count(v: Any, name: str) -> tuple[int | None, str | None]:
    if v is None:
        return None, None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    elif isinstance(v, (str, bytes)):
        text = _text(v) or ""
        if text.strip().isascii() and text.strip().isdigit():  # "¹".isdigit() is True, int() refuses it
            return int(text.strip()), f"{name} stored as TEXT {text[:40]!r}; read as a number"
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= rules.INT64_MAX:
        return v, None
    return None, f"{name} {_text(v)[:40]!r} is not a count; dropped"  # type: ignore[index]


def _cost(v: Any, name: str) -> tuple[float | None, str | None]:
    if v is None:
        return None, None
    try:
        number = float(v) if isinstance(v, (int, float, str, bytes)) and not isinstance(v, bool) else math.nan
    except ValueError:
        number = math.nan
    if math.isfinite(number) and 0 <= number <= rules.MAX_COST:
        return number, None if isinstance(v, (int, float)) else f"{name} stored as TEXT; read as a number"
    return None, f"{name} {_text(v)[:40]!r} is not a cost; left unknown"  # type: ignore[index]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_refuse_constant)


def _json_field(v: Any, name: str, kinds: tuple[type, ...]) -> tuple[Any, str | None]:
    """Decode a JSON TEXT column to one of ``kinds``; double encoding is undone (with a note)."""
    if v is None:
        return None, None
    if isinstance(v, (list, dict)):
        value: Any = v
        layers = 0
    else:
        text = _text(v) or ""
        if not text.strip():
            return None, None
        if not isinstance(v, (str, bytes)):
            return None, f"{name} holds {type(v).__name__} {text[:40]!r}, not JSON; dropped"
        try:
            value, layers = _loads(text), 1
            while isinstance(value, str) and layers < 4:
                value, layers = _loads(value), layers + 1
        except (ValueError, RecursionError) as e:
            return None, f"{name} is not valid JSON ({str(e)[:60]}); dropped"
    note = f"{name} was JSON-encoded {layers} times; decoded" if layers > 1 else None
    if list in kinds and isinstance(value, dict) and dict not in kinds:
        return [value], f"{name} held one object instead of a list; wrapped in a list"
    if isinstance(value, kinds):
        return value, note
    want = " or ".join("an object" if k is dict else "a list" for k in kinds)
    return None, f"{name} holds {type(value).__name__ if value is not None else 'null'}, not {want}; dropped"


def _is_parts(value: Any) -> bool:
    """A list of multimodal content parts: objects that each carry a string ``type``."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in value))


def _content(v: Any) -> tuple[Any, str | None]:
    if v is None:
        return None, None
    note = None
    if isinstance(v, bytes):
        v, note = v.decode("utf-8", "replace"), "content stored as a BLOB; decoded as UTF-8"
    elif not isinstance(v, str):
        return _text(v), f"content stored as {type(v).__name__}; kept as text"
    for prefix in _CONTENT_PREFIXES:
        if v.startswith(prefix):
            payload = v[len(prefix):]
            try:
                value, layers = _loads(payload), 1
                while isinstance(value, str) and layers < 4 and value.lstrip()[:1] in ("[", "{", '"'):
                    value, layers = _loads(value), layers + 1
            except (ValueError, RecursionError):
                return payload, "content marked as JSON is not valid JSON; kept as text"
            if isinstance(value, (list, dict, str)):
                return value, (f"content was JSON-encoded {layers} times; decoded" if layers > 1 else note)
            return payload, f"content marked as JSON holds {type(value).__name__}; kept as text"
    head = v.lstrip()[:1]
    if head in ("[", '"'):
        try:
            value, layers = _loads(v), 1
            while isinstance(value, str) and layers < 4:
                value, layers = _loads(value), layers + 1
        except (ValueError, RecursionError):
            return v, note
        if _is_parts(value):
            return value, "content held JSON-encoded multimodal parts; decoded"
    return v, note


def _shrink_inline_data(value: Any) -> Any:
    """``value`` with every long ``data:`` URI (inline images, files) replaced by a short note."""
    if isinstance(value, str):
        if value.startswith("data:") and len(value) > 65536:
            head = value[:value.find(",") + 1 if "," in value[:200] else 40]
            return f"{head}... ({len(value)} characters omitted by the import)"
        return value
    if isinstance(value, list):
        return [_shrink_inline_data(v) for v in value]
    if isinstance(value, dict):
        return {k: _shrink_inline_data(v) for k, v in value.items()}
    return value


def _limit_content(v: Any) -> tuple[Any, str | None]:
    """Content that fits the 8 MiB limit: long text is truncated; structured content first loses
    its inline ``data:`` payloads, then becomes its text parts."""
    if not isinstance(v, (list, dict)):
        return _limit_text(v, "content")
    try:
        size = len(json.dumps(v, ensure_ascii=False).encode("utf-8", "replace"))
    except (TypeError, ValueError, RecursionError):
        return None, "content could not be encoded; dropped"
    if size <= rules.MAX_TEXT_BYTES - 1024:
        return v, None
    smaller = _shrink_inline_data(v)
    if len(json.dumps(smaller, ensure_ascii=False).encode("utf-8", "replace")) <= rules.MAX_TEXT_BYTES - 1024:
        return smaller, "content larger than 8 MiB; inline data: payloads were replaced by a note"
    from sqlite_export.transcript import content_text

    text, _ = _limit_text(content_text(smaller), "content")
    return text, "content larger than 8 MiB; kept its text only"


def _limit_text(v: Any, name: str) -> tuple[Any, str | None]:
    if isinstance(v, str) and len(v) > rules.MAX_TEXT_BYTES // 4:
        raw = v.encode("utf-8")
        if len(raw) > rules.MAX_TEXT_BYTES:
            cut = raw[: rules.MAX_TEXT_BYTES - 64].decode("utf-8", "ignore")
            return cut, f"{name} longer than 8 MiB; truncated"
    return v, None


# ---------------------------------------------------------------------------------------
# Ids


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


def map_session_id(raw: str) -> str:
    """The eventlog id of a Hermes session id: itself when valid, else ``h-<sha1 prefix>``."""
    return raw if rules.ID_RE.fullmatch(raw) else "h-" + _sha(raw)[:20]


def _eid(sid: str, *parts: Any) -> str:
    tail = ":".join(str(p) for p in parts)
    candidate = f"hermes:{sid}:{tail}"
    return candidate if len(candidate) <= 128 else f"hermes:{_sha(sid)[:24]}:{tail}"


# ---------------------------------------------------------------------------------------
# The import


class _Importer:
    def __init__(self, store: Any, report: ImportReport, progress: Progress | None) -> None:
        self.store = store
        self.log: Log = store.log
        self.report = report
        self.progress = progress
        self.done = 0
        self.total = 0
        self.batch: list[tuple[dict[str, Any], str]] = []  # (event, label for warnings)
        self.seq_of: dict[str, int] = {}  # event id -> seq, for events whose seq is needed later
        self.want: set[str] = set()

    def store_get(self, sid: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] | None = self.store.get_session(sid)
            return result
        except Exception:  # a read-model hiccup only costs the accuracy of one warning
            return None

    # -------------------------------------------------------------- writing

    def warn(self, where: str, problem: str | None) -> None:
        if problem:
            self.report.warn(f"{where}: {problem}")

    def build(self, etype: str, sid: str, data: dict[str, Any], eid: str, where: str,
              required: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """``make_event``, dropping (with a warning) each optional field it refuses."""
        data = dict(data)
        for _ in range(len(data) + 8):
            try:
                return ev.make_event(etype, sid, data, id=eid)
            except ValidationError as e:
                if e.field == "data":  # too large as a whole: shed the bulkiest optional fields
                    shed = next((k for k in _SHEDDABLE if data.get(k) is not None), None)
                    if shed is not None:
                        self.warn(where, f"event too large; dropped {shed}")
                        data[shed] = None
                        continue
                    if isinstance(data.get("content"), str) and len(data["content"]) > 1024:
                        data["content"] = data["content"][: len(data["content"]) // 2]
                        self.warn(where, "event too large; content truncated")
                        continue
                    if data.get("content") is not None:
                        data["content"] = None
                        self.warn(where, "event too large; content dropped")
                        continue
                name = re.split(r"[.\[]", e.field[5:], maxsplit=1)[0] if e.field.startswith("data.") else ""
                if not name or name not in data or name in required:
                    self.warn(where, f"not imported: {e.problem} ({e.field})")
                    return None
                self.warn(where, f"{name} dropped: {e.problem}")
                del data[name]
        self.warn(where, "not imported: too many invalid fields")
        return None

    def add(self, event: dict[str, Any] | None, label: str, want_seq: bool = False) -> None:
        if event is None:
            return
        if want_seq:
            self.want.add(event["id"])
        self.batch.append((event, label))
        if len(self.batch) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.batch:
            return
        batch, self.batch = self.batch, []
        head = self.log.head()[0]
        try:
            seqs = self.log.append([e for e, _ in batch])
            results: list[int | None] = list(seqs)
        except (DuplicateEventError, ValidationError):
            results = [self._append_one(e, label) for e, label in batch]
        for (event, _), seq in zip(batch, results):
            if seq is None:
                continue
            if event["id"] in self.want:
                self.seq_of[event["id"]] = seq
            if seq <= head:
                self.report.already_present += 1
                continue
            self.report.events += 1
            kind = event["type"]
            if kind == "session.created":
                self.report.sessions += 1
            elif kind == "message.appended":
                self.report.messages += 1
            elif kind == "usage.recorded":
                self.report.usage += 1
        if self.progress:
            self.progress(min(self.done, self.total), self.total)

    def _append_one(self, event: dict[str, Any], label: str) -> int | None:
        """Append one event after its batch was refused; returns its seq, or None if refused.

        A seq at or below the head seen before the batch counts as already present; a new
        event gets a seq above it, so the caller's accounting stays right.
        """
        try:
            return self.log.append([event])[0]
        except DuplicateEventError as e:
            self.report.warn(f"{label}: differs from the version a previous import stored "
                             f"(event {event['id']}); kept the stored version")
            self.report.skipped += 1
            if event["id"] in self.want:
                self.seq_of[event["id"]] = e.seq
            return None
        except ValidationError as e:
            self.report.warn(f"{label}: not imported: {e}")
            self.report.skipped += 1
            return None


def import_hermes(store: Any, source_path: str | os.PathLike[str], *,
                  progress: Progress | None = None) -> ImportReport:
    """Import a Hermes Agent ``state.db`` at ``source_path`` into ``store``'s profile.

    Returns an :class:`ImportReport`. Raises :class:`ValidationError` (field ``"source"``) when
    the file does not exist or is not a Hermes state.db (no ``sessions`` table), and
    :class:`StorageError` when it cannot be read at all; damaged rows never raise. The caller
    calls ``store.sync()`` before reading through the store's read model.
    """
    path = Path(source_path)
    if not path.is_file():
        raise ValidationError("source", f"{path} does not exist or is not a file")
    report = ImportReport()
    imp = _Importer(store, report, progress)
    doing = "opening"
    try:
        with tempfile.TemporaryDirectory(prefix="eventlog-hermes-") as tmp:
            conn = _open_source(path, Path(tmp), report)
            doing = "reading"
            with closing(conn):
                s_cols = _columns(conn, "sessions")
                m_cols = _columns(conn, "messages")
                if "id" not in s_cols:
                    raise ValidationError("source", f"{path} has no sessions table with an id column; "
                                          "it does not look like a Hermes state.db")
                _run(imp, conn, s_cols, m_cols)
    except EventLogError:
        raise
    except (sqlite3.Error, OSError, ValueError) as e:  # the one boundary of the import
        raise converted(e, f"{doing} {path}", hint="check the file's permissions, or stop Hermes and retry") from e
    return report


def _count_rows(conn: sqlite3.Connection, table: str) -> int:
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.Error:
        return 0


def _select(cols: set[str], wanted: tuple[str, ...]) -> str:
    return ", ".join(c if c in cols else f"NULL AS {c}" for c in wanted)


def _run(imp: _Importer, conn: sqlite3.Connection, s_cols: set[str], m_cols: set[str]) -> None:
    report = imp.report
    conn.row_factory = sqlite3.Row
    srows = conn.execute(f"SELECT {_select(s_cols, _SESSION_COLUMNS)} FROM sessions").fetchall()
    n_messages = _count_rows(conn, "messages") if "session_id" in m_cols else 0
    imp.total = len(srows) + n_messages
    sessions = _plan_sessions(imp, srows)
    _write_sessions(imp, sessions)
    if "session_id" in m_cols:
        _write_messages(imp, conn, m_cols, sessions)
    elif m_cols:
        report.warn("source: the messages table has no session_id column; no messages imported")
    _write_endings(imp, sessions)
    imp.flush()
    imp.done = imp.total
    if imp.progress:
        imp.progress(imp.total, imp.total)


@dataclass
class _Session:
    raw: str
    sid: str
    row: sqlite3.Row
    where: str
    parent_raw: str | None = None
    parent: str | None = None  # final id of the parent (in the source or not)
    started: float | None = None
    known: bool = False  # its session.created is already in the log
    root: str = ""
    inactive_run: list[str] = field(default_factory=list)  # event ids of a pending rewound run


def _plan_sessions(imp: _Importer, srows: list[sqlite3.Row]) -> dict[str, _Session]:
    """Source sessions by raw id, with final ids, parents and order decided; in write order."""
    report = imp.report
    by_raw: dict[str, _Session] = {}
    used: set[str] = set()
    for n, row in enumerate(srows, 1):
        raw = _text(row["id"])
        if raw is None or raw == "":
            report.warn(f"session row {n}: no id; skipped")
            report.skipped += 1
            continue
        if raw in by_raw:
            report.warn(f"session {raw!r}: appears twice; the second row was skipped")
            report.skipped += 1
            continue
        sid = map_session_id(raw)
        where = f"session {raw!r}"
        if sid != raw:
            report.warn(f"{where}: id does not fit [A-Za-z0-9_.:@-]{{1,128}}; imported as {sid!r}")
            where = f"session {raw!r} (imported as {sid!r})"
        # An id the profile already uses for a session this importer did not create.
        if imp.log.event_seq(_eid(sid, "created")) is None and imp.log.stream_version(sid) > 0:
            other = "h-" + _sha("hermes:" + raw)[:20]
            report.warn(f"{where}: the profile already has another session with this id; imported as {other!r}")
            sid, where = other, f"session {raw!r} (imported as {other!r})"
            if imp.log.event_seq(_eid(sid, "created")) is None and imp.log.stream_version(sid) > 0:
                report.warn(f"{where}: that id is taken too; skipped")
                report.skipped += 1
                continue
        if sid in used:
            report.warn(f"{where}: its id {sid!r} is already taken by another source session; skipped")
            report.skipped += 1
            continue
        used.add(sid)
        s = _Session(raw=raw, sid=sid, row=row, where=where)
        s.started, problem = _time(row["started_at"], "started_at")
        imp.warn(where, problem)
        s.parent_raw = _text(row["parent_session_id"]) or None
        by_raw[raw] = s

    # Parents: final ids; self-links and cycles are cut.
    for s in by_raw.values():
        if s.parent_raw is None:
            continue
        if s.parent_raw == s.raw:
            imp.warn(s.where, "is its own parent; the link was dropped")
            s.parent_raw = None
        elif s.parent_raw in by_raw:
            s.parent = by_raw[s.parent_raw].sid
        else:
            s.parent = map_session_id(s.parent_raw)
            if imp.store_get(s.parent) is None:
                imp.warn(s.where, f"parent {s.parent_raw!r} is not in the source; the link is kept "
                                  "(nothing is inherited until that session exists)")
    ordered = sorted(by_raw.values(), key=lambda s: (s.started is None, s.started or 0.0, s.raw))
    out: dict[str, _Session] = {}
    for s in ordered:
        chain: list[_Session] = []
        on_chain: set[str] = set()
        cur: _Session | None = s
        while cur is not None and cur.raw not in out:
            if cur.raw in on_chain:  # a cycle: cut the link that closes it
                imp.warn(chain[-1].where, f"parent {chain[-1].parent_raw!r} forms a cycle; the link was dropped")
                chain[-1].parent_raw = chain[-1].parent = None
                break
            chain.append(cur)
            on_chain.add(cur.raw)
            cur = by_raw.get(cur.parent_raw) if cur.parent_raw is not None else None
        for member in reversed(chain):
            out[member.raw] = member
    for s in out.values():  # roots within the source (parents come first in ``out``)
        parent = out.get(s.parent_raw) if s.parent_raw is not None else None
        s.root = parent.root if parent is not None else s.raw
    return out


def _session_data(imp: _Importer, s: _Session, taken: set[str]) -> dict[str, Any]:
    row, where = s.row, s.where
    data: dict[str, Any] = {}
    for name in ("source", "model", "cwd", "git_repo_root", "git_branch", "chat_type",
                 "user_id", "chat_id", "thread_id"):
        value = _text(row[name])
        if value is not None:
            data[name] = value
    config, problem = _json_field(row["model_config"], "model_config", (dict,))
    imp.warn(where, problem)
    if config is not None:
        data["model_config"] = config
    if s.parent is not None:
        data["parent_session_id"] = s.parent
    if s.started is not None:
        data["started_at"] = s.started
    title = _text(row["title"])
    if title is not None:
        title = rules.normalize_title(title)
        if len(title) > rules.MAX_TITLE:
            imp.warn(where, f"title longer than {rules.MAX_TITLE} characters; shortened")
            title = title[: rules.MAX_TITLE].rstrip()
        if title:
            if title in taken:
                new = ev.next_title(title, taken)
                imp.warn(where, f"title {title!r} is already used by another session; imported as {new!r}")
                title = new
            taken.add(title)
            data["title"] = title
            provenance = _text(row["title_source"])
            data["title_source"] = "user" if provenance is None else _TITLE_SOURCES.get(provenance, "llm")
    return data


def _flag(v: Any) -> bool:
    if isinstance(v, (int, float)):
        return v != 0
    text = (_text(v) or "").strip().lower()
    return text not in ("", "0", "false", "no", "null")


def _write_sessions(imp: _Importer, sessions: dict[str, _Session]) -> None:
    report = imp.report
    try:
        imp.store.sync(timeout=300.0)  # titles other processes gave their sessions count too
    except EventLogError as e:
        report.warn(f"profile: the read model did not catch up ({e}); a title taken meanwhile "
                    "leaves the imported session untitled")
    taken = {t for t in (x.get("title") for x in imp.store.list_sessions(
        archived=None, pinned=None, hidden=None, limit=None)) if isinstance(t, str)}
    # Lineage flags: one decision per source lineage, applied on its root.
    flags: dict[str, dict[str, set[bool]]] = {}
    for s in sessions.values():
        for name in rules.FLAGS:
            flags.setdefault(s.root, {}).setdefault(name, set()).add(_flag(s.row[name]))
    dropped: list[str] = []
    for s in sessions.values():
        imp.done += 1
        created = _eid(s.sid, "created")
        if imp.log.event_seq(created) is not None:
            s.known = True
            report.already_present += 1
        else:
            event = imp.build("session.created", s.sid, _session_data(imp, s, taken), created, s.where)
            if event is None:
                report.skipped += 1
                dropped.append(s.raw)
                continue
            imp.add(event, s.where)
        names, problem = _json_field(s.row["tool_names"], "tool_names", (list,))
        imp.warn(s.where, problem)
        if names is not None:
            clean = [n for n in names if isinstance(n, str)]
            if len(clean) != len(names):
                imp.warn(s.where, "tool_names held non-text items; they were dropped")
            imp.add(imp.build("session.meta_updated", s.sid, {"tool_names": clean},
                              _eid(s.sid, "tool_names"), s.where), s.where)
        if s.root == s.raw:
            for name, etype in (("archived", "session.archived"), ("pinned", "session.pinned"),
                                ("hidden", "session.hidden")):
                values = flags[s.raw][name]
                if True in values:
                    if False in values:
                        imp.warn(s.where, f"its lineage is only partly {name} in the source; "
                                          f"the whole lineage was {name} (eventlog flags lineages as a unit)")
                    imp.add(imp.build(etype, s.sid, {}, _eid(s.sid, name), s.where), s.where)
    for raw in dropped:  # their messages are reported as orphans
        del sessions[raw]
    imp.flush()


def _message_rows(imp: _Importer, conn: sqlite3.Connection, m_cols: set[str]) -> Iterator[sqlite3.Row]:
    key = "id" if "id" in m_cols else "rowid"
    cols = _select(m_cols, _MESSAGE_COLUMNS[1:])
    last: Any = None
    while True:
        try:
            if last is None:
                rows = conn.execute(f"SELECT {key} AS _rid, {cols} FROM messages ORDER BY {key} LIMIT ?",
                                    (MESSAGE_CHUNK,)).fetchall()
            else:
                rows = conn.execute(f"SELECT {key} AS _rid, {cols} FROM messages WHERE {key} > ? "
                                    f"ORDER BY {key} LIMIT ?", (last, MESSAGE_CHUNK)).fetchall()
        except sqlite3.DatabaseError as e:
            imp.report.warn(f"source: reading messages after row {last} failed ({e}); the rest was not imported")
            return
        if not rows:
            return
        yield from rows
        last = rows[-1]["_rid"]


def _message_data(imp: _Importer, row: sqlite3.Row, where: str) -> dict[str, Any] | None:
    report = imp.report
    role = _text(row["role"])
    if role is None or role.strip().lower() not in ev.ROLES:
        report.warn(f"{where}: role {role!r} is not one of {'|'.join(sorted(ev.ROLES))}; row skipped")
        report.skipped += 1
        return None
    if role not in ev.ROLES:
        imp.warn(where, f"role {role!r} read as {role.strip().lower()!r}")
        role = role.strip().lower()
    data: dict[str, Any] = {"role": role}
    content, problem = _content(row["content"])
    imp.warn(where, problem)
    content, problem = _limit_content(content)
    imp.warn(where, problem)
    if content is not None:
        data["content"] = content
    for name, kinds in (("tool_calls", (list,)), ("display_metadata", (dict,)),
                        ("reasoning_details", (list, dict))):
        value, problem = _json_field(row[name], name, kinds)
        imp.warn(where, problem)
        if value is not None:
            data[name] = value
    for name in ("tool_name", "tool_call_id", "finish_reason", "display_kind"):
        value = _text(row[name])
        if value is not None:
            data[name] = value
    reasoning = _text(row["reasoning"]) or _text(row["reasoning_content"])
    if reasoning:
        data["reasoning"], problem = _limit_text(reasoning, "reasoning")
        imp.warn(where, problem)
    count, problem = _count(row["token_count"], "token_count")
    imp.warn(where, problem)
    if count is not None:
        data["token_count"] = count
    stamp, problem = _time(row["timestamp"], "timestamp")
    imp.warn(where, problem)
    if stamp is not None:
        data["timestamp"] = stamp
    return data


def _rewind(imp: _Importer, s: _Session) -> None:
    """Hide the session's pending run of rewound messages (appended just before)."""
    run, s.inactive_run = s.inactive_run, []
    if any(eid not in imp.seq_of for eid in run):
        imp.flush()
    seq = next((imp.seq_of[eid] for eid in run if eid in imp.seq_of), None)
    if seq is None:
        return
    first_row = run[0].rsplit(":", 1)[-1]
    imp.add(imp.build("messages.rewound", s.sid, {"message_id": seq}, _eid(s.sid, "rewound", first_row),
                      s.where), s.where)


def _write_messages(imp: _Importer, conn: sqlite3.Connection, m_cols: set[str],
                    sessions: dict[str, _Session]) -> None:
    report = imp.report
    orphans: dict[str, list[Any]] = {}
    visibility = "active" in m_cols
    for row in _message_rows(imp, conn, m_cols):
        imp.done += 1
        rid = row["_rid"]
        raw_sid = _text(row["session_id"])
        s = sessions.get(raw_sid) if raw_sid is not None else None
        if s is None:
            orphans.setdefault(repr(raw_sid), []).append(rid)
            report.skipped += 1
            continue
        where = f"{s.where} message row {rid}"
        data = _message_data(imp, row, where)
        if data is None:
            continue
        active = True
        if visibility:
            active = _flag(row["active"]) if row["active"] is not None else True
            if not active and "compacted" in m_cols and _flag(row["compacted"]):
                active = True  # summarized by compression, still part of the visible history
        if active and s.inactive_run:
            _rewind(imp, s)
        eid = _eid(s.sid, "msg", rid)
        event = imp.build("message.appended", s.sid, data, eid, where, required=("role",))
        if event is None:
            report.skipped += 1
            continue
        if not active:
            s.inactive_run.append(eid)
        imp.add(event, where, want_seq=not active)
    for s in sessions.values():
        if s.inactive_run:
            _rewind(imp, s)
    for raw_sid, rows in orphans.items():
        shown = ", ".join(str(r) for r in rows[:10]) + (f" and {len(rows) - 10} more" if len(rows) > 10 else "")
        report.warn(f"session {raw_sid}: not in the source; its message rows {shown} were skipped (orphans)")


def _write_endings(imp: _Importer, sessions: dict[str, _Session]) -> None:
    for s in sessions.values():
        row, where = s.row, s.where
        usage: dict[str, Any] = {"task": IMPORT_TASK}
        model = _text(row["model"])
        provider = _text(row["billing_provider"])
        if model:
            usage["model"] = model
        if provider:
            usage["provider"] = provider
        meaningful = False
        for name in rules.TOKENS:
            value, problem = _count(row[name], name)
            imp.warn(where, problem and problem.replace("dropped", "counted as 0"))
            if value:
                usage[name] = value
                meaningful = True
        for name in rules.COSTS:
            cost, problem = _cost(row[name], name)
            imp.warn(where, problem)
            if cost is not None:
                usage[name] = cost
                meaningful = True
        if meaningful:
            imp.add(imp.build("usage.recorded", s.sid, usage, _eid(s.sid, "usage"), where), where)
        reason = _text(row["end_reason"])
        ended, problem = _time(row["ended_at"], "ended_at")
        imp.warn(where, problem)
        if (reason and reason.strip()) or row["ended_at"] is not None:
            data: dict[str, Any] = {"reason": reason if reason and reason.strip() else "unknown"}
            if ended is not None:
                data["ended_at"] = ended
            imp.add(imp.build("session.ended", s.sid, data, _eid(s.sid, "ended"), where,
                              required=("reason",)), where)


__all__ = ["ImportReport", "import_hermes", "map_session_id"]
