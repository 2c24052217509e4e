"""Every contender the benchmark knows, by name.

A name is ``group.mode``.  ``--only`` takes names or groups, and treats ``.`` and
``_`` alike (``eventlog_log_bare`` == ``eventlog.log_bare``).  ``kind`` is
``run`` (the main comparison at ``--messages``) or ``scale`` (one point of the
scale curve; only with ``--scale``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Contender:
    name: str
    target: str          # "module:function"
    label: str
    kind: str = "run"

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0]

    def load(self) -> Callable[..., dict[str, Any]]:
        mod, fn = self.target.split(":")
        return getattr(importlib.import_module(mod), fn)


CONTENDERS: list[Contender] = [
    # eventlog (slots: see bench/contenders_eventlog.py)
    Contender("eventlog.single_synced", "bench.contenders_eventlog:single_synced",
              "SessionStore.append_message, 1 thread, synced"),
    Contender("eventlog.threads8", "bench.contenders_eventlog:threads8",
              "SessionStore.append_message, 8 threads (group commit)"),
    Contender("eventlog.batch100", "bench.contenders_eventlog:batch100",
              "SessionStore.append_messages, <=100 per call"),
    Contender("eventlog.catchup_and_rebuild", "bench.contenders_eventlog:catchup_and_rebuild",
              "projection catch-up, full rebuild, search"),
    Contender("eventlog.readers_under_load", "bench.contenders_eventlog:readers_under_load",
              "open + list_sessions(50) + close while another process appends at full speed"),
    Contender("eventlog.projection_lag", "bench.contenders_eventlog:projection_lag",
              "ack -> visible in a follower's projection, writer process at 1,000 appends/s"),
    Contender("eventlog.log_bare", "bench.contenders_eventlog:log_bare",
              "EventLog.append, 1 event per call, 1 thread"),
    Contender("eventlog.log_bare_threads8", "bench.contenders_eventlog:log_bare_threads8",
              "EventLog.append, 1 event per call, 8 threads"),
    Contender("eventlog.log_bare_batch100", "bench.contenders_eventlog:log_bare_batch100",
              "EventLog.append, <=100 events per call"),
    Contender("eventlog.log_paired", "bench.contenders_eventlog:log_paired",
              "EventLog.append vs bare LMDB puts (1 and 4 B-trees), interleaved blocks, one process"),
    # Baseline A
    Contender("baseline_sqlite.single", "bench.baseline_sqlite:single",
              "state.db WAL+FULL, BEGIN IMMEDIATE per message, FTS triggers"),
    Contender("baseline_sqlite.threads8", "bench.baseline_sqlite:threads8",
              "same, 8 threads, busy_timeout 0 + jittered retries"),
    # Baseline B
    Contender("baseline_es.single", "bench.baseline_es:single",
              "eventsourcing + SQLite, save per event"),
    Contender("baseline_es.batch100", "bench.baseline_es:batch100",
              "eventsourcing + SQLite, <=100 events per save"),
    Contender("baseline_es.threads8", "bench.baseline_es:threads8",
              "eventsourcing + SQLite, 8 threads, one app"),
    # Floor
    Contender("floor.lmdb_single", "bench.floor:lmdb_single", "bare synced LMDB put+commit per event"),
    Contender("floor.lmdb_threads8", "bench.floor:lmdb_threads8", "bare synced LMDB puts, 8 threads"),
    Contender("floor.lmdb_batch100", "bench.floor:lmdb_batch100", "bare synced LMDB, <=100 puts per commit"),
    Contender("floor.lmdb_group8", "bench.floor:lmdb_group8",
              "bare synced LMDB, 8 puts per commit from one thread (ceiling of 8-caller group commit)"),
    Contender("floor.lmdb4_group8", "bench.floor:lmdb4_group8",
              "as lmdb_group8 on eventlog's four B-trees (events, ids, streams, meta)"),
    Contender("floor.lmdb4_single", "bench.floor:lmdb4_single",
              "bare synced LMDB, one event per commit on eventlog's four B-trees"),
    Contender("floor.file_fsync", "bench.floor:file_fsync", "plain file append + fsync per event"),
    # PostgreSQL (issue 19; bench/postgres.py: each starts its own server)
    Contender("postgres.paired8", "bench.postgres:paired8",
              "PostgresLog.append 8 threads vs plain INSERT 8 connections, alternating blocks, one server"),
    Contender("postgres.single", "bench.postgres:single", "PostgresLog.append, 1 event per call, 1 thread"),
    Contender("postgres.two_hosts", "bench.postgres:two_hosts", "two writer processes x 8 threads, one log"),
    Contender("postgres.follow_lag", "bench.postgres:follow_lag",
              "ack -> PostgresLog.follow in another process, writer at --lag-rate"),
    Contender("postgres.es_threads8", "bench.postgres:es_threads8", "eventsourcing + PostgreSQL, 8 threads, one app"),
    # Scale curve points
    Contender("eventlog.scale", "bench.contenders_eventlog:scale_point", "eventlog at size N", kind="scale"),
    Contender("baseline_sqlite.scale", "bench.baseline_sqlite:scale_point", "baseline A at size N", kind="scale"),
    Contender("baseline_es.scale", "bench.baseline_es:scale_point", "baseline B at size N", kind="scale"),
    Contender("floor.scale", "bench.floor:scale_point", "bare LMDB at size N", kind="scale"),
    Contender("baseline_bare_rebuild.scale", "bench.baseline_bare:scale_point",
              "same rows into eventlog's schema by executemany + one FTS5 'rebuild', at size N", kind="scale"),
]

BY_NAME = {c.name: c for c in CONTENDERS}


def _norm(s: str) -> str:
    return s.strip().lower().replace(".", "_").replace("-", "_")


def select(only: str | None, kind: str) -> list[Contender]:
    """Contenders of ``kind`` matching the comma-separated ``only`` (all if None).
    Raises ValueError naming any token that matches nothing at all."""
    pool = [c for c in CONTENDERS if c.kind == kind]
    if not only:
        return pool
    tokens = [_norm(t) for t in only.split(",") if t.strip()]
    unknown = [t for t in tokens if not any(_norm(c.name) == t or _norm(c.name).startswith(t + "_")
                                            for c in CONTENDERS)]
    if unknown:
        raise ValueError(f"unknown contender(s): {', '.join(unknown)}; known: "
                         + ", ".join(sorted({c.group for c in CONTENDERS} | set(BY_NAME))))
    return [c for c in pool if any(_norm(c.name) == t or _norm(c.name).startswith(t + "_") for t in tokens)]
