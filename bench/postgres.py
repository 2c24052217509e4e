"""PostgreSQL contenders (group ``postgres``, issue 19): ``PostgresLog`` beside the floor a user
would measure it against (a plain INSERT of the same rows) and the ``eventsourcing`` library's
PostgreSQL recorder, on one server.

Each contender starts its own throwaway server (``tests/pg_server.py``: ``initdb --no-sync``,
then the server with fsync and synchronous_commit on, data in the system temp folder) unless
``EVENTLOG_BENCH_PG_URL`` names an administrator URL of a server to use instead. Events are the
workload's messages as ``message.appended`` events (median ~400 B of content). A contender
writes at most ``PG_MAX_EVENTS`` (20,000) events, fewer with ``--messages``.

* ``paired8``: 8 threads appending one event per ``PostgresLog.append`` (group commit), and 8
  connections each INSERTing the same rows one per transaction into a table of the same layout
  (identity seq, unique id, session index, bytea body holding the event as eventlog stores it,
  format 2 compressed without a dictionary, made outside the clock): the floor. Blocks of ``PAIRED_BLOCK``
  events alternate between the two (the order flips every block) so that both see the same
  minutes of the disk; the ratio of their rates is the issue's figure (target >= 0.5).
* ``single``: one thread, one event per append (the latency of one synced commit).
* ``two_hosts``: two writer processes (``bench.pg_writer``), 8 threads each, one log.
* ``follow_lag``: a writer process at ``--lag-rate`` appends/s (8 threads) prints each ack's
  CLOCK_MONOTONIC time; this process follows the log (LISTEN/NOTIFY) and notes when each seq
  arrives. Lag = arrival - ack (target p99 <= 50 ms).
* ``es_threads8``: ``eventsourcing`` with ``PERSISTENCE_MODULE=eventsourcing.postgres``, an
  aggregate per session, 8 threads sharing one application, one save per message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.common import Recorder, RunStats, make_result, perf

ROOT = Path(__file__).resolve().parent.parent
PG_MAX_EVENTS = 20_000
PAIRED_BLOCK = 1000


class ContenderUnavailable(RuntimeError):
    """psycopg, the server binaries or eventsourcing's PostgreSQL module are missing."""


@contextmanager
def server() -> Iterator[str]:
    """An administrator URL: ``$EVENTLOG_BENCH_PG_URL``, or a server started for this contender."""
    url = os.environ.get("EVENTLOG_BENCH_PG_URL")
    if url:
        yield url
        return
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from pg_server import PgServer
    except ImportError as e:
        raise ContenderUnavailable(f"tests/pg_server.py not importable: {e}") from e
    try:
        srv = PgServer().start()
    except (FileNotFoundError, RuntimeError) as e:
        raise ContenderUnavailable(str(e)) from e
    try:
        yield srv.url()
    finally:
        srv.close()


def _events(workload: Any, n: int) -> list[tuple[str, dict[str, Any]]]:
    from bench.contenders_eventlog import msg_event

    out = []
    for m in workload.messages(0, n):
        out.append((m["session_id"], msg_event(m["session_id"], m)))
    return out


def _cap(workload: Any) -> int:
    return min(PG_MAX_EVENTS, workload.n_messages)


def _profile() -> str:
    return f"bench-{os.getpid()}-{int(time.time())}"


def _run_threads(parts: list[list[Any]], call: Callable[[int, Any], Any], rec: Recorder) -> float:
    """Run ``call(thread, item)`` over each thread's part, all released together; wall seconds."""
    barrier = threading.Barrier(len(parts) + 1)
    recs = [Recorder() for _ in parts]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        barrier.wait()
        try:
            for item in parts[i]:
                t0 = perf()
                call(i, item)
                recs[i].add(perf() - t0)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(parts))]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = perf()
    for t in ts:
        t.join()
    wall = perf() - t0
    if errors:
        raise errors[0]
    for r in recs:
        rec.extend(r)
    return wall


def _split(items: list[tuple[str, Any]], n: int) -> list[list[tuple[str, Any]]]:
    """By session, so each session has one writer (as the other threaded contenders do)."""
    parts: list[list[tuple[str, Any]]] = [[] for _ in range(n)]
    owner: dict[str, int] = {}
    for sid, e in items:
        i = owner.setdefault(sid, len(owner) % n)
        parts[i].append((sid, e))
    return parts


FLOOR_DDL = [
    "CREATE TABLE floor (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL UNIQUE, "
    "session text, body bytea NOT NULL)",
    "CREATE INDEX ON floor (session, seq) WHERE session IS NOT NULL",
]


def paired8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    try:
        import psycopg

        from eventlog.log import codec, stored
        from eventlog.log.postgres import PostgresLog
    except ImportError as e:
        raise ContenderUnavailable(f"psycopg missing: {e}") from e
    n, threads = _cap(workload), int(opts.get("threads", 8))
    events = _events(workload, n)
    # The floor inserts what eventlog stores for each event (format 2: header + zstd data),
    # sealed and compressed outside the clock.
    rows = []
    zstd = stored.Compression(lambda _id: None)
    for i, (sid, e) in enumerate(events):
        p = codec.prepare(e)
        ts = time.time_ns()
        digest = codec.seal(p, i + 1, ts, codec.ZERO_HASH)[1]
        rows.append((sid, (p.id, sid, stored.pack(p, ts, codec.ZERO_HASH, digest, zstd))))
    with server() as url:
        with psycopg.connect(url, autocommit=True) as c:
            for stmt in FLOOR_DDL:
                c.execute(stmt)
        log = PostgresLog.open(url, profile=_profile())
        conns = [psycopg.connect(url, autocommit=True) for _ in range(threads)]
        for c in conns:
            c.execute("SET synchronous_commit = on")
        try:
            sessions = sorted({sid for sid, _ in events})
            log.append([{"type": "session.created", "session": s, "data": {"source": "bench"}} for s in sessions])
            rec_log, rec_floor = Recorder(), Recorder()
            secs_log = secs_floor = 0.0
            blocks = 0
            block_rates: list[tuple[int, int]] = []
            for start in range(0, n, PAIRED_BLOCK):
                ev_parts = _split(events[start:start + PAIRED_BLOCK], threads)
                row_parts = _split(rows[start:start + PAIRED_BLOCK], threads)

                def run_log() -> float:
                    return _run_threads(ev_parts, lambda i, it: log.append([it[1]]), rec_log)

                def run_floor() -> float:
                    return _run_threads(row_parts, lambda i, it: conns[i].execute(
                        "INSERT INTO floor (id, session, body) VALUES (%s, %s, %s)", it[1]), rec_floor)

                if blocks % 2 == 0:
                    a = run_log()
                    b = run_floor()
                else:
                    b = run_floor()
                    a = run_log()
                secs_log += a
                secs_floor += b
                block_rates.append((round(len(ev_parts and events[start:start + PAIRED_BLOCK]) / a),
                                    round(len(events[start:start + PAIRED_BLOCK]) / b)))
                print(f"block {blocks}: log {block_rates[-1][0]}/s floor {block_rates[-1][1]}/s "
                      f"commits {log.commits}", file=sys.stderr, flush=True)
                blocks += 1
            verified = log.verify().ok
            commits = log.commits
            size = log.size_bytes()
        finally:
            log.close()
            for c in conns:
                c.close()
    st = RunStats()
    st.rec, st.seconds, st.messages, st.items = rec_log, secs_log, n, n
    floor = Recorder()
    floor.extend(rec_floor)
    floor_rate = n / secs_floor
    res = make_result(f"postgres.paired{threads}", st, dir, extra={
        "threads": threads, "blocks": blocks, "block_events": PAIRED_BLOCK, "commits": commits,
        "events_per_commit": round(n / max(1, commits), 2), "verify_ok": verified, "server_bytes": size,
        "floor_insert_per_s": round(floor_rate, 1), "floor_latency_ms": floor.summary(),
        "ratio_to_floor": round((n / secs_log) / floor_rate, 3),
        "block_rates_log_floor": block_rates})
    return res


def single(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    try:
        from eventlog.log.postgres import PostgresLog
    except ImportError as e:
        raise ContenderUnavailable(f"psycopg missing: {e}") from e
    n = min(_cap(workload), 5000)
    events = _events(workload, n)
    with server() as url, PostgresLog.open(url, profile=_profile()) as log:
        sessions = sorted({sid for sid, _ in events})
        log.append([{"type": "session.created", "session": s, "data": {"source": "bench"}} for s in sessions])
        rec = Recorder()
        for _sid, e in events:
            t0 = perf()
            log.append([e])
            rec.add(perf() - t0)
    st = RunStats()
    st.rec, st.seconds, st.messages, st.items = rec, rec.total(), n, n
    return make_result("postgres.single", st, dir, extra={})


def _writer(url: str, profile: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "bench.pg_writer", "--url", url, "--profile", profile, *args],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def _done(out: str) -> dict[str, Any]:
    for line in out.splitlines():
        if line.startswith("done "):
            return dict(json.loads(line[5:]))
    raise RuntimeError("writer process ended without a result")


def two_hosts(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    try:
        from eventlog.log.postgres import PostgresLog
    except ImportError as e:
        raise ContenderUnavailable(f"psycopg missing: {e}") from e
    n, threads = _cap(workload), int(opts.get("threads", 8))
    with server() as url:
        profile = _profile()
        PostgresLog.open(url, profile=profile).close()
        procs = [_writer(url, profile, "--name", f"h{h}", "--threads", str(threads), "--count", str(n // 2))
                 for h in range(2)]
        outs = [p.communicate()[0] for p in procs]
        dones = [_done(o) for o in outs]
        with PostgresLog.open(url, profile=profile) as log:
            verified, head = log.verify().ok, log.head()[0]
    wall = max(d["t_end"] for d in dones) - min(d["t_start"] for d in dones)
    st = RunStats()
    st.seconds, st.messages = wall, sum(d["appends"] for d in dones)
    st.items = st.messages
    res = make_result("postgres.two_hosts", st, dir, extra={
        "threads_per_host": threads, "hosts": [{"rate": d["rate"], "append_ms": d["append_ms"]} for d in dones],
        "verify_ok": verified, "head": head})
    # Latency of the union: the two hosts' p50/p99 are in extra; report the worse host's here.
    worst = max(dones, key=lambda d: d["append_ms"].get("p99", 0))
    res["latency_ms"] = worst["append_ms"]
    return res


def follow_lag(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    try:
        from eventlog.log.postgres import PostgresLog
    except ImportError as e:
        raise ContenderUnavailable(f"psycopg missing: {e}") from e
    rate = float(opts.get("lag_rate", 1000.0))
    seconds = float(opts.get("lag_seconds", 10.0))
    threads = int(opts.get("threads", 8))
    arrived: dict[int, float] = {}
    with server() as url:
        profile = _profile()
        with PostgresLog.open(url, profile=profile) as log:
            stop = threading.Event()

            def follow() -> None:
                for env in log.follow(1, timeout=None):
                    arrived[env["seq"]] = time.monotonic()
                    if stop.is_set():
                        return

            t = threading.Thread(target=follow, daemon=True)
            t.start()
            time.sleep(0.3)  # the LISTEN connection is up
            w = _writer(url, profile, "--threads", str(threads), "--rate", str(rate), "--seconds", str(seconds),
                        "--acks")
            out = w.communicate()[0]
            acks = []
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == "a":
                    acks.append((int(parts[1]), float(parts[2])))
            done = _done(out)
            top = max((s for s, _ in acks), default=0)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and max(arrived, default=0) < top:
                time.sleep(0.01)
            stop.set()
            log.append([{"type": "bench.stop", "data": {}}])  # let the follower see the stop
            t.join(5)
    rec = Recorder()
    unseen = early = 0
    for seq, t_ack in acks:
        t_seen = arrived.get(seq)
        if t_seen is None:
            unseen += 1
            continue
        lag = t_seen - t_ack
        if lag < 0:  # the follower had it before the writer took its timestamp
            early += 1
            lag = 0.0
        rec.add(lag)
    st = RunStats()
    st.rec, st.messages, st.items = rec, len(acks), len(acks)
    st.seconds = float(done.get("t_end", 0) - done.get("t_start", 0)) or seconds
    return make_result("postgres.follow_lag", st, dir, unit="append", extra={
        "target_rate": rate, "achieved_rate": done.get("rate"), "writer_append_ms": done.get("append_ms"),
        "never_seen": unseen, "seen_before_ack_timestamp": early, "follower": "PostgresLog.follow (LISTEN/NOTIFY)"})


def es_threads8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    try:
        import eventsourcing.postgres  # noqa: F401
        from psycopg.conninfo import conninfo_to_dict

        from bench.baseline_es import SessionApp, _Store
    except ImportError as e:
        raise ContenderUnavailable(f"eventsourcing's PostgreSQL module is not importable: {e}") from e
    n, threads = _cap(workload), int(opts.get("threads", 8))
    msgs = list(workload.messages(0, n))
    with server() as url:
        info = conninfo_to_dict(url)
        env = {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": str(info["dbname"]),
               "POSTGRES_HOST": str(info["host"]), "POSTGRES_PORT": str(info["port"]),
               "POSTGRES_USER": str(info["user"]), "POSTGRES_PASSWORD": str(info["password"]),
               "POSTGRES_POOL_SIZE": str(threads), "POSTGRES_MAX_OVERFLOW": "2"}
        os.environ.update(env)
        app = SessionApp(env=env)
        store = _Store(app)
        try:
            parts = _split([(m["session_id"], m) for m in msgs], threads)
            rec = Recorder()
            wall = _run_threads(parts, lambda i, it: store.append(it[1]), rec)
            events = store.events()
        finally:
            app.close()
    st = RunStats()
    st.rec, st.seconds, st.messages, st.items = rec, wall, n, n
    return make_result(f"postgres.es_threads{threads}", st, dir, events=events, extra={
        "threads": threads, "sessions": len(store.aggs), "library": "eventsourcing.postgres"})


def issue19_targets(results: dict[str, dict[str, Any]], target: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 19's figures: throughput against the plain-INSERT floor, p99, follower lag, two
    hosts, and eventsourcing's recorder beside it (``target`` is bench.__main__'s ``_target``)."""
    def ok(name: str) -> dict[str, Any] | None:
        r = results.get(name)
        return r if r and r.get("ok") else None

    t: list[dict[str, Any]] = []
    r = ok("postgres.paired8")
    if r:
        ex = r["extra"]
        v = ex["ratio_to_floor"]
        detail = (f"PostgresLog 8 threads {r['messages_per_s']:,.0f} ev/s (p99 {r['latency_ms'].get('p99')} ms, "
                  f"{ex['events_per_commit']} events/commit) vs plain INSERT 8 connections "
                  f"{ex['floor_insert_per_s']:,.0f} rows/s (p99 {ex['floor_latency_ms'].get('p99')} ms), "
                  f"{ex['blocks']} alternating blocks")
    else:
        v, detail = None, "needs postgres.paired8"
    t.append(target(19, "8 writers, single events: PostgresLog / plain INSERT from 8 connections >= 0.5x",
                    v, 0.5, True, detail))
    r = ok("postgres.follow_lag")
    if r:
        ex = r["extra"]
        v = r["latency_ms"].get("p99")
        detail = (f"ack -> follower in another process: p50 {r['latency_ms'].get('p50')} ms, max "
                  f"{r['latency_ms'].get('max')} ms over {r['messages']:,} appends at {ex.get('achieved_rate')}/s"
                  + (f"; {ex['never_seen']} never seen" if ex.get("never_seen") else ""))
    else:
        v, detail = None, "needs postgres.follow_lag"
    t.append(target(19, "follower lag p99 across processes <= 50 ms", v, 50.0, False, detail, unit="ms"))
    h, p, e = ok("postgres.two_hosts"), ok("postgres.paired8"), ok("postgres.es_threads8")
    if h:
        v = h["messages_per_s"]
        hosts = h["extra"]["hosts"]
        detail = ("two writer processes x 8 threads: " + ", ".join(f"{x['rate']:,.0f}/s p99 {x['append_ms'].get('p99')} ms"
                                                                   for x in hosts)
                  + (f"; one host (paired8) {p['messages_per_s']:,.0f}/s" if p else ""))
        t.append(target(19, "context, not a target: two hosts appending to one log, events/s", v, 0, True, detail,
                        unit="events/s"))
    if e and p:
        v = round(p["messages_per_s"] / e["messages_per_s"], 2)
        detail = (f"PostgresLog 8 threads {p['messages_per_s']:,.0f} ev/s vs eventsourcing.postgres 8 threads "
                  f"{e['messages_per_s']:,.0f} ev/s (p99 {e['latency_ms'].get('p99')} ms) on the same kind of server")
        t.append(target(19, "context, not a target: PostgresLog / eventsourcing's PostgreSQL recorder", v, 1.0, True,
                        detail))
    return t
