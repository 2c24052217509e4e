"""STAND-IN for the extension mechanism of issue 13, until it lands on main (then delete this file).

It offers the API of the brief (``Extension``, ``EventType``, ``ReadModel``; appending extension
events; a read model caught up to the log) on top of today's public surfaces, so that switching
the adapters to the real thing is mechanical:

- :func:`append_events` validates extension events with their registered type and appends them
  to the store's log (same log, same chain).
- :func:`read_model` yields a connection on a side SQLite file ``ext-<name>.db`` in the profile
  directory, first applying every log event after its cursor under SQLite's own write lock
  (``BEGIN IMMEDIATE``: one catch-up at a time across processes). The cursor (seq and hash) is
  stored in the same transaction as the rows, and the file is rebuilt when the log it was
  derived from is not this one or the model's version changed.
"""
from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import orjson

from eventlog.errors import EventTooLargeError, ValidationError
from eventlog.profiles import profile_dir

MAX_EVENT_BYTES = 16 * 1024 * 1024
_CHUNK = 2000


@dataclass(frozen=True)
class EventType:
    name: str
    version: int = 1
    validate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    upcasters: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadModel:
    name: str
    version: int
    ddl: Sequence[str]
    apply: Callable[[sqlite3.Connection, dict[str, Any]], None]


@dataclass(frozen=True)
class Extension:
    namespace: str
    event_types: Sequence[EventType] = ()
    read_models: Sequence[ReadModel] = ()


class _Attached:
    def __init__(self, store: Any, extensions: Sequence[Extension]) -> None:
        self.store = store
        self.types = {t.name: t for e in extensions for t in e.event_types}
        self.models = {m.name: m for e in extensions for m in e.read_models}
        self.conns: dict[str, sqlite3.Connection] = {}  # the catch-up (writer) connection per model
        self.readers: list[sqlite3.Connection] = []
        self.local = threading.local()  # one read connection per thread and model
        self.lock = threading.RLock()

    def reader(self, name: str, path: Path) -> sqlite3.Connection:
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        conn = conns.get(name)
        if conn is None:
            conn = conns[name] = _connect(path)
            with self.lock:
                self.readers.append(conn)
        return conn

    def close(self) -> None:
        with self.lock:
            for conn in [*self.conns.values(), *self.readers]:
                try:
                    conn.close()
                except sqlite3.ProgrammingError:
                    pass
            self.conns.clear()
            self.readers.clear()


_attached: dict[int, _Attached] = {}
_attached_lock = threading.Lock()


def attach(store: Any, extensions: Sequence[Extension]) -> None:
    with _attached_lock:
        _attached[id(store)] = _Attached(store, extensions)


def detach(store: Any) -> None:
    with _attached_lock:
        a = _attached.pop(id(store), None)
    if a is not None:
        a.close()


def _get(store: Any) -> _Attached:
    with _attached_lock:
        a = _attached.get(id(store))
    if a is None or a.store is not store:
        raise ValidationError("extensions", "this store was opened without extensions")
    return a


def append_events(store: Any, events: list[dict[str, Any]], expected_version: int | None = None) -> list[int]:
    """Validate and append a batch of extension events (and session-catalogue events, checked
    by the catalogue, e.g. an adapter's ``message.appended`` in the same atomic batch)."""
    from eventlog.sessions import events as catalogue

    a = _get(store)
    batch = []
    for i, e in enumerate(events):
        et = a.types.get(e.get("type"))  # type: ignore[arg-type]
        if et is None and e.get("type") in catalogue.CURRENT_VERSIONS:
            try:
                session: Any = e.get("session")
                batch.append(catalogue.make_event(e["type"], session, e.get("data")))
            except ValidationError as err:
                raise ValidationError(f"events[{i}].{err.field}", err.problem) from None
            continue
        if et is None:
            raise ValidationError(f"events[{i}].type", "not an event type of a registered extension")
        data = e.get("data") or {}
        if et.validate is not None:
            try:
                data = et.validate(data)
            except ValidationError as err:
                raise ValidationError(f"events[{i}].data.{err.field}", err.problem) from None
        out = {"type": et.name, "v": et.version, "session": e.get("session"), "data": data}
        if e.get("id") is not None:
            out["id"] = e["id"]
        if len(orjson.dumps(out)) + 512 > MAX_EVENT_BYTES:
            raise EventTooLargeError(f"events[{i}].data", "the encoded event exceeds 16 MiB")
        batch.append(out)
    if not batch:
        return []
    seqs: list[int] = store._append(batch, expected_version=expected_version)  # read-your-writes bookkeeping
    return seqs


def _upcast(a: _Attached, env: dict[str, Any]) -> dict[str, Any]:
    et = a.types.get(env.get("type"))  # type: ignore[arg-type]
    v = env.get("v", 1)
    if et is None or type(v) is not int or v >= et.version or not isinstance(env.get("data"), dict):
        return env
    out = dict(env)
    data = dict(env["data"])
    while v < et.version and v in et.upcasters:
        data = et.upcasters[v](data)
        v += 1
    out["data"], out["v"] = data, v
    return out


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS ext_meta (key TEXT PRIMARY KEY, value)")
    return conn


def _meta(conn: sqlite3.Connection, key: str) -> Any:
    row = conn.execute("SELECT value FROM ext_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def _reset(conn: sqlite3.Connection, model: ReadModel) -> None:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
              if r[0].startswith(model.name + "_")]
    for t in tables:
        conn.execute(f'DROP TABLE IF EXISTS "{t}"')
    for stmt in model.ddl:
        conn.execute(stmt)
    conn.execute("DELETE FROM ext_meta")
    conn.executemany("INSERT INTO ext_meta VALUES (?, ?)",
                     [("version", model.version), ("seq", 0), ("hash", "0" * 64)])


def catch_up(a: _Attached, model: ReadModel, conn: sqlite3.Connection) -> int:
    """Apply the log's new events to ``model``'s tables; returns how many were applied."""
    log = a.store.log
    head = log.head()[0]
    if _meta(conn, "seq") == head and _meta(conn, "version") == model.version:
        return 0  # current (a tampered or replaced log is caught by the next catch-up that has work)
    conn.execute("BEGIN IMMEDIATE")
    try:
        seq, h = _meta(conn, "seq"), _meta(conn, "hash")
        stale = _meta(conn, "version") != model.version or seq is None or seq > head
        if not stale and seq:
            env = log.get(seq)
            stale = env is None or env.get("hash") != h
        if stale:
            _reset(conn, model)
            seq = 0
        applied = 0
        last = None
        for env in log.read(seq + 1):
            model.apply(conn, _upcast(a, env))
            last = env
            applied += 1
            if applied % _CHUNK == 0:
                conn.execute("UPDATE ext_meta SET value = ? WHERE key = 'seq'", (last["seq"],))
                conn.execute("UPDATE ext_meta SET value = ? WHERE key = 'hash'", (last["hash"],))
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
        if last is not None:
            conn.execute("UPDATE ext_meta SET value = ? WHERE key = 'seq'", (last["seq"],))
            conn.execute("UPDATE ext_meta SET value = ? WHERE key = 'hash'", (last["hash"],))
        conn.execute("COMMIT")
        return applied
    except BaseException:
        conn.execute("ROLLBACK")
        raise


@contextmanager
def read_model(store: Any, name: str) -> Iterator[sqlite3.Connection]:
    a = _get(store)
    model = a.models.get(name)
    if model is None:
        raise ValidationError("name", f"no read model {name!r} is registered")
    path = profile_dir(store.home, store.profile) / f"ext-{name}.db"
    with a.lock:
        conn = a.conns.get(name)
        if conn is None:
            conn = a.conns[name] = _connect(path)
        catch_up(a, model, conn)
    reader = a.reader(name, path)
    reader.execute("BEGIN")  # one snapshot for the caller's queries, at least as new as the catch-up
    try:
        yield reader
    finally:
        reader.execute("COMMIT")


def rebuild(store: Any, name: str) -> None:
    """Drop ``name``'s tables and derive them again from the whole log."""
    a = _get(store)
    model = a.models[name]
    with a.lock:
        conn = a.conns.get(name) or _connect(profile_dir(store.home, store.profile) / f"ext-{name}.db")
        a.conns[name] = conn
        conn.execute("BEGIN IMMEDIATE")
        _reset(conn, model)
        conn.execute("COMMIT")
        catch_up(a, model, conn)
