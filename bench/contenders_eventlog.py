"""eventlog contenders.

Every place that relies on a detail of eventlog's public API is marked ``# API:``.
The API used (DESIGN.md "Public surfaces")::

    from eventlog import SessionStore
    with SessionStore.open(home=dir, profile="bench") as s:
        sid = s.create_session(source="bench")
        seq = s.append_message(sid, role=..., content=..., tool_calls=..., tool_name=...,
                               tool_call_id=..., reasoning=..., token_count=...)
        seqs = s.append_messages(sid, [dict(role=..., content=...), ...])
        s.sync(); stats = s.rebuild(); hits = s.search("query")

    from eventlog.log import EventLog
    log = EventLog.open(path)
    log.append([{"type": "message.appended", "session": sid, "data": {...}}])

Sessions are created *untimed*, in the driver's ``prepare`` hook before each
chunk, because ``create_session`` is its own durable call (baseline A inserts its
session row inside the first message's transaction, baseline B saves ``Created``
with the first message: both are ~2% of calls and cost no extra sync there).

If ``eventlog`` (or the part a contender needs) cannot be imported, each function
raises ``ContenderUnavailable``; ``run_one`` reports that as "unavailable" and the
targets that depend on it as N/A.
"""
from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.common import Recorder, RunStats, dir_size, drive_single, drive_threads, make_result, perf, scale_record

PROFILE = "bench"
FIELDS = ("role", "content", "tool_calls", "tool_name", "tool_call_id", "reasoning", "token_count")


class ContenderUnavailable(RuntimeError):
    """The eventlog API this contender needs is not importable (yet)."""


def _session_store() -> Any:
    try:
        from eventlog import SessionStore  # API: the facade, importable from the package root
    except ImportError as e:
        raise ContenderUnavailable(f"`from eventlog import SessionStore` failed: {e}") from e
    return SessionStore


def _event_log() -> Any:
    try:
        from eventlog.log import EventLog  # API
    except ImportError as e:
        raise ContenderUnavailable(f"`from eventlog.log import EventLog` failed: {e}") from e
    return EventLog


def _open_store(dir: str) -> Any:
    return _session_store().open(home=dir, profile=PROFILE)  # API: durability defaults to synced


def _log_path(dir: str) -> Path:
    # DESIGN.md "On disk": $EVENTLOG_HOME/profiles/<profile>/log
    p = Path(dir) / "profiles" / PROFILE / "log"
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def msg_kwargs(m: dict[str, Any]) -> dict[str, Any]:
    """Workload message -> append_message keyword arguments (None fields left out)."""
    return {k: m[k] for k in FIELDS if m[k] is not None}


def msg_event(sid: str, m: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message.appended", "session": sid, "v": 2, "data": msg_kwargs(m)}


class _Sessions:
    """Maps workload session ids to store session ids, creating sessions untimed."""

    def __init__(self, create: Callable[[str], str]) -> None:
        self.create = create
        self.ids: dict[str, str] = {}

    def prepare(self, chunk: Sequence[Any]) -> None:
        for item in chunk:
            wsid = item[0] if isinstance(item, tuple) else item["session_id"]
            if wsid not in self.ids:
                self.ids[wsid] = self.create(wsid)


def _store_sessions(s: Any) -> _Sessions:
    return _Sessions(lambda wsid: s.create_session(source="bench"))  # API: returns the new session id


def _log_sessions(log: Any) -> _Sessions:
    def create(wsid: str) -> str:
        log.append([{"type": "session.created", "session": wsid, "data": {"source": "bench"}}])  # API
        return wsid

    return _Sessions(create)


# ---------------------------------------------------------------------------------------
# SessionStore contenders


def single_synced(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """``append_message`` one at a time, one thread, default (synced) durability."""
    with _open_store(dir) as s:
        sess = _store_sessions(s)

        def call(m: dict[str, Any]) -> None:
            s.append_message(sess.ids[m["session_id"]], **msg_kwargs(m))

        st = drive_single(workload.chunks(opts.get("chunk", 5000)), call, prepare=sess.prepare,
                          budget=opts.get("budget"))
        n_sessions = len(sess.ids)
    return make_result("eventlog.single_synced", st, dir, events=st.messages + n_sessions,
                       extra={"sessions": n_sessions, "note": "sessions created untimed"})


def threads8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """8 threads share one SessionStore (group commit); each owns its sessions."""
    n = opts.get("threads", 8)
    with _open_store(dir) as s:
        sess = _store_sessions(s)

        def call(m: dict[str, Any]) -> None:
            s.append_message(sess.ids[m["session_id"]], **msg_kwargs(m))

        st = drive_threads(workload.chunks(opts.get("chunk", 5000)), lambda i: call, threads=n,
                           prepare=sess.prepare, budget=opts.get("budget"))
        n_sessions = len(sess.ids)
    return make_result(f"eventlog.threads{n}", st, dir, events=st.messages + n_sessions,
                       extra={"threads": n, "sessions": n_sessions})


def batch100(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """``append_messages`` with up to 100 consecutive messages of one session per call."""
    with _open_store(dir) as s:
        sess = _store_sessions(s)

        def call(batch: tuple[str, list[dict[str, Any]]]) -> None:
            s.append_messages(sess.ids[batch[0]], [msg_kwargs(m) for m in batch[1]])  # API

        st = drive_single(workload.batch_chunks(100, opts.get("chunk", 5000)), call, prepare=sess.prepare,
                          count=lambda b: len(b[1]), budget=opts.get("budget"))
        n_sessions = len(sess.ids)
    return make_result("eventlog.batch100", st, dir, events=st.messages + n_sessions, unit="batch",
                       extra={"sessions": n_sessions, "mean_batch": round(st.messages / max(1, st.items), 1)})


def _populate_log(workload: Any, dir: str, stop: int | None = None) -> tuple[int, float]:
    """Write session.created + message.appended events straight to the log in
    batches (no projection runs).  Returns (events, seconds)."""
    EventLog = _event_log()
    log = EventLog.open(_log_path(dir))  # API
    seen: set[str] = set()
    events = 0
    t0 = perf()
    try:
        for sid, msgs in workload.batches(100, stop=stop):
            batch = []
            if sid not in seen:
                seen.add(sid)
                batch.append({"type": "session.created", "session": sid, "data": {"source": "bench"}})
            batch.extend(msg_event(sid, m) for m in msgs)
            log.append(batch)
            events += len(batch)
    finally:
        log.close()  # API: py-lmdb refuses a second open of one env in a process
    return events, perf() - t0


def catchup_and_rebuild(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """The log is written first with no projection running; then the projection
    catches up (time of ``SessionStore.open`` + ``sync()``, whichever does the work),
    then a full ``rebuild()``, then FTS searches."""
    events, populate_s = _populate_log(workload, dir)
    st_rec = Recorder()
    t0 = perf()
    with _open_store(dir) as s:
        s.sync()  # API: brings projections up to the log head
        catchup_s = perf() - t0
        t1 = perf()
        stats = s.rebuild()  # API: full rebuild from the log; returns stats
        rebuild_s = perf() - t1
        srec = Recorder()
        for term in workload.search_terms(opts.get("searches", 100)):
            t2 = perf()
            s.search(term)  # API
            srec.add(perf() - t2)
    st_rec.add(rebuild_s)
    st = RunStats()
    st.rec = st_rec
    st.seconds = rebuild_s
    st.messages = workload.n_messages
    st.items = 1
    res = make_result("eventlog.catchup_and_rebuild", st, dir, events=events, extra={
        "populate_s": round(populate_s, 3),
        "populate_events_per_s": round(events / populate_s, 1) if populate_s else None,
        "catchup_s": round(catchup_s, 4),
        "catchup_events_per_s": round(events / catchup_s, 1) if catchup_s else None,
        "rebuild_s": round(rebuild_s, 4),
        "rebuild_events_per_s": round(events / rebuild_s, 1) if rebuild_s else None,
        "rebuild_stats": _jsonable(stats),
        "search_ms": srec.summary(),
        "note": "rates = rebuild",
    })
    return res


# ---------------------------------------------------------------------------------------
# bare log contenders (no SessionStore, no projection)


def _open_log(dir: str) -> Any:
    return _event_log().open(_log_path(dir))  # API: durability defaults to synced


def log_bare(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """``EventLog.append([one message event])`` per call, one thread."""
    log = _open_log(dir)
    try:
        sess = _log_sessions(log)
        st = drive_single(workload.chunks(opts.get("chunk", 5000)),
                          lambda m: log.append([msg_event(m["session_id"], m)]),
                          prepare=sess.prepare, budget=opts.get("budget"))
    finally:
        log.close()
    return make_result("eventlog.log_bare", st, dir, events=st.messages + len(sess.ids),
                       extra={"sessions": len(sess.ids)})


def log_bare_threads8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """8 threads, one shared EventLog, single-event appends (group commit)."""
    n = opts.get("threads", 8)
    log = _open_log(dir)
    try:
        sess = _log_sessions(log)
        call = lambda m: log.append([msg_event(m["session_id"], m)])  # noqa: E731
        st = drive_threads(workload.chunks(opts.get("chunk", 5000)), lambda i: call, threads=n,
                           prepare=sess.prepare, budget=opts.get("budget"))
    finally:
        log.close()
    return make_result(f"eventlog.log_bare_threads{n}", st, dir, events=st.messages + len(sess.ids),
                       extra={"threads": n, "sessions": len(sess.ids)})


def log_bare_batch100(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """``EventLog.append`` of up to 100 message events of one session per call."""
    log = _open_log(dir)
    try:
        sess = _log_sessions(log)
        st = drive_single(workload.batch_chunks(100, opts.get("chunk", 5000)),
                          lambda b: log.append([msg_event(b[0], m) for m in b[1]]),
                          prepare=sess.prepare, count=lambda b: len(b[1]), budget=opts.get("budget"))
    finally:
        log.close()
    return make_result("eventlog.log_bare_batch100", st, dir, events=st.messages + len(sess.ids), unit="batch",
                       extra={"sessions": len(sess.ids), "mean_batch": round(st.messages / max(1, st.items), 1)})


PAIRED_BLOCK = 250
"""Calls per block in ``log_paired``: each block runs the three contenders back to back."""


def log_paired(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """``EventLog.append`` of one event per call, beside the bare floors, in one process.

    The same messages go, in blocks of PAIRED_BLOCK calls, to ``EventLog.append``, to a bare
    synced LMDB put on one B-tree (``floor.lmdb_single``'s loop) and to a bare synced commit on
    the four B-trees eventlog keeps (``floor.lmdb4_single``'s); the order of the three is
    rotated block by block (all six orders in turn). The disk of this VM drifts by 10-40%
    between minutes, so contenders run in separate processes minutes apart can disagree on a
    ratio by more than the ratio's margin; interleaved blocks see the same disk. The result is
    EventLog's; the floors' latencies and the ratios are in ``extra``.
    """
    from itertools import permutations

    from bench.floor import Four, _Putter, envelope_bytes, open_env

    log = _open_log(dir)
    floor_dir = Path(dir) / "floors"
    (floor_dir / "one").mkdir(parents=True)
    one = open_env(str(floor_dir / "one"))
    one_put = _Putter(one).put
    four = Four(floor_dir / "four")
    recs = {"eventlog": Recorder(), "lmdb_single": Recorder(), "lmdb4_single": Recorder()}
    orders = list(permutations(recs))
    block = int(opts.get("block") or PAIRED_BLOCK)
    st = RunStats()
    deadline = None if not opts.get("budget") else perf() + float(opts["budget"])
    seq = 0
    events: list[dict[str, Any]] = []
    raws: list[tuple[str, bytes]] = []
    calls = {  # the same message i, three ways
        "eventlog": lambda i: log.append([events[i]]),
        "lmdb_single": lambda i: one_put(raws[i]),
        "lmdb4_single": lambda i: four.commit(("", [raws[i]])),
    }
    try:
        sess = _log_sessions(log)
        for chunk in workload.chunks(opts.get("chunk", 5000)):
            sess.prepare(chunk)  # untimed, as in log_bare
            events.clear()
            raws.clear()
            for m in chunk:
                seq += 1
                events.append(msg_event(m["session_id"], m))
                raws.append((m["session_id"], envelope_bytes(seq, m)))
            for b0 in range(0, len(chunk), block):
                for who in orders[(b0 // block + st.items // block) % len(orders)]:
                    call, rec = calls[who], recs[who]
                    for i in range(b0, min(b0 + block, len(chunk))):
                        t0 = perf()
                        call(i)
                        rec.add(perf() - t0)
            st.items += len(chunk)
            st.messages += len(chunk)
            if deadline is not None and perf() > deadline:
                st.truncated = True
                break
    finally:
        log.close()
        one.close()
        four.close()
    st.rec = recs["eventlog"]
    st.seconds = st.rec.total()
    floors = {k: recs[k].summary() for k in ("lmdb_single", "lmdb4_single")}

    def r(a: dict[str, Any], b: dict[str, Any], q: str) -> float | None:
        return round(a[q] / b[q], 3) if a.get(q) and b.get(q) else None

    ev = st.rec.summary()
    extra = {
        "block": block,
        "sessions": len(sess.ids),
        "floor_latency_ms": floors,
        "floor_rate": {k: round(len(recs[k]) / recs[k].total(), 1) for k in floors if recs[k].total() > 0},
        "p50_vs_lmdb_single": r(ev, floors["lmdb_single"], "p50"),
        "p50_vs_lmdb4_single": r(ev, floors["lmdb4_single"], "p50"),
        "lmdb4_vs_lmdb_single_p50": r(floors["lmdb4_single"], floors["lmdb_single"], "p50"),
        "p99_vs_lmdb_single": r(ev, floors["lmdb_single"], "p99"),
    }
    return make_result("eventlog.log_paired", st, str(_log_path(dir)), events=st.messages + len(sess.ids),
                       extra=extra)


# ---------------------------------------------------------------------------------------
# the read side under a concurrent writer process (issue 4 figures)


def _writer_cmd(dir: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bench.load_writer", "--dir", dir, "--profile", PROFILE, *extra]


class _Writer:
    """A ``bench.load_writer`` subprocess: waits for its ``ready`` line; ``acks`` collects the
    ``(seq, t_ack)`` it prints (a reader thread drains its stdout); ``stop()`` closes its stdin
    and returns its ``done`` summary."""

    def __init__(self, dir: str, *extra: str) -> None:
        self.acks: list[tuple[int, float]] = []
        self.done: dict[str, Any] | None = None
        self.proc = subprocess.Popen(_writer_cmd(dir, *extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            err = self.proc.stderr.read() if self.proc.stderr else ""  # type: ignore[union-attr]
            self.proc.kill()
            raise RuntimeError(f"load writer did not start: {line!r} {err.strip()[-400:]}")
        self.head_at_ready = int(line.split()[1])
        self._drain = threading.Thread(target=self._read, name="writer-stdout", daemon=True)
        self._drain.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        acks = self.acks
        for line in self.proc.stdout:
            if line.startswith("a "):
                _a, seq, t = line.split()
                acks.append((int(seq), float(t)))
            elif line.startswith("done "):
                self.done = json.loads(line[5:])

    @property
    def finished(self) -> bool:
        return self.proc.poll() is not None and not self._drain.is_alive()

    def stop(self, timeout: float = 120.0) -> dict[str, Any]:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(10)
        err = self.proc.stderr.read() if self.proc.stderr else ""  # type: ignore[union-attr]
        if self.done is None:
            raise RuntimeError(f"load writer exited {self.proc.returncode} without a summary: {err.strip()[-400:]}")
        if self.done.get("error"):
            raise RuntimeError(f"load writer failed: {self.done['error']}")
        return self.done


def _prefill(workload: Any, dir: str) -> dict[str, Any]:
    """The workload written straight to the log, then projected by one open + sync (untimed
    setup for the read-side contenders)."""
    events, populate_s = _populate_log(workload, dir)
    t0 = perf()
    with _open_store(dir) as s:
        s.sync(timeout=600)
        sessions = len(s.list_sessions(limit=1_000_000))
    return {"events": events, "populate_s": round(populate_s, 3), "project_s": round(perf() - t0, 3),
            "sessions": sessions}


def readers_under_load(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """A writer process appends through SessionStore at full speed (synced, ``--writer-threads``
    threads) while this process measures, ``samples`` times each:

    * ``SessionStore.open`` + ``list_sessions(limit=50)`` + ``close()`` (a fresh reader, as a CLI
      or a second agent would do; the open heals/catches up what the writer appended since the
      previous sample, because no daemon does it for us) -- the headline latency;
    * ``list_sessions(limit=50)`` on one long-lived store (each call first applies what is new).

    py-lmdb refuses a second open of one environment in a process, so the two phases run one
    after the other (the writer keeps appending through both)."""
    samples = max(1, int(opts.get("samples", 500)))
    wthreads = int(opts.get("writer_threads", 4))
    budget = float(opts.get("budget") or 0) or 300.0
    SessionStore = _session_store()
    pre = _prefill(workload, dir)
    writer = _Writer(dir, "--threads", str(wthreads))
    open_rec, list_rec, close_rec, fresh_rec, live_rec = Recorder(), Recorder(), Recorder(), Recorder(), Recorder()
    rows_seen: list[int] = []
    try:
        time.sleep(0.2)  # let the writer reach full speed
        # phase 1: fresh open + list + close
        heads: list[int] = []
        t_phase = perf()
        deadline = t_phase + budget / 2
        for _ in range(samples):
            t0 = perf()
            s = SessionStore.open(home=dir, profile=PROFILE, follower=False)  # a one-shot reader, as the CLI opens it
            t1 = perf()
            rows = s.list_sessions(limit=50)
            t2 = perf()
            heads.append(s.log.head()[0])  # untimed
            rows_seen.append(len(rows))
            t3 = perf()
            s.close()
            t4 = perf()
            open_rec.add(t1 - t0)
            list_rec.add(t2 - t1)
            close_rec.add(t4 - t3)
            fresh_rec.add((t2 - t0) + (t4 - t3))
            if perf() > deadline:
                break
        phase1_s = perf() - t_phase
        appended1 = heads[-1] - heads[0] if heads else 0
        # phase 2: one long-lived store
        with SessionStore.open(home=dir, profile=PROFILE) as s:
            h0 = s.log.head()[0]
            t_phase = perf()
            deadline = t_phase + budget / 2
            for _ in range(samples):
                t0 = perf()
                rows = s.list_sessions(limit=50)
                live_rec.add(perf() - t0)
                if perf() > deadline:
                    break
            phase2_s = perf() - t_phase
            appended2 = s.log.head()[0] - h0
            lag_at_end = s.projection_lag()
    finally:
        done = writer.stop()
    st = RunStats()
    st.rec = fresh_rec
    st.messages = appended1 + appended2
    st.seconds = phase1_s + phase2_s
    st.items = len(fresh_rec)
    st.truncated = len(fresh_rec) < samples or len(live_rec) < samples
    live, fresh = live_rec.summary(), fresh_rec.summary()
    res = make_result("eventlog.readers_under_load", st, dir, unit="sample", extra={
        "samples": len(fresh_rec),
        "open_list_close_ms": fresh,
        "open_ms": open_rec.summary(),
        "list_after_open_ms": list_rec.summary(),
        "close_ms": close_rec.summary(),
        "list_long_lived_ms": live,
        "rows_min": min(rows_seen) if rows_seen else None,
        "appended_during_fresh_phase": appended1,
        "appended_during_long_lived_phase": appended2,
        "fresh_phase_s": round(phase1_s, 3),
        "long_lived_phase_s": round(phase2_s, 3),
        "writer": done,
        "writer_threads": wthreads,
        "projection_lag_at_end": lag_at_end,
        "prefill": pre,
        "note": (f"lat = open+list(50)+close; long-lived list(50) p50/p99 {live.get('p50', 0):.2f}/"
                 f"{live.get('p99', 0):.2f} ms; msgs/s = writer process meanwhile ({wthreads} thr)"),
    })
    total_msgs = workload.n_messages + (done.get("appends") or 0)
    res["disk_bytes_per_message"] = round(dir_size(dir)["allocated"] / total_msgs, 1) if total_msgs else None
    return res


def projection_lag(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """A writer process appends through SessionStore at a fixed ``lag_rate`` (1,000/s) for
    ``lag_seconds`` (10 s), printing ``(seq, t_ack)`` after each append returns.  This process
    holds a SessionStore opened with ``follower=True`` (no other process projects) and polls
    ``store._projector.cursor()`` every 1 ms; an event's lag is the time from its ack to the
    first poll that saw the cursor at or past its seq (CLOCK_MONOTONIC in both processes)."""
    rate = float(opts.get("lag_rate", 1000.0))
    seconds = float(opts.get("lag_seconds", 10.0))
    wthreads = int(opts.get("threads", 8))
    poll = 0.001
    SessionStore = _session_store()
    pre = _prefill(workload, dir)
    obs_t: list[float] = []
    obs_c: list[int] = []
    polls = 0
    with SessionStore.open(home=dir, profile=PROFILE, follower=True) as s:  # API: follower option
        cursor = s._projector.cursor
        writer = _Writer(dir, "--threads", str(wthreads), "--rate", str(rate), "--seconds", str(seconds), "--acks")
        try:
            last = -1
            settle_deadline: float | None = None
            while True:
                c = cursor()
                t = time.monotonic()
                polls += 1
                if c > last:
                    obs_t.append(t)
                    obs_c.append(c)
                    last = c
                if writer.finished:
                    if settle_deadline is None:
                        settle_deadline = t + 10.0
                    top = max((a[0] for a in writer.acks), default=0)
                    if c >= top or t > settle_deadline:
                        break
                time.sleep(poll)
        finally:
            done = writer.stop()
    acks = sorted(writer.acks)
    rec = Recorder()
    unseen = early = 0
    for seq, t_ack in acks:
        i = bisect.bisect_left(obs_c, seq)
        if i >= len(obs_c):
            unseen += 1
            continue
        seen = obs_t[i] - t_ack
        if seen < 0:  # the poll saw the commit before the writer took its timestamp
            early += 1
            seen = 0.0
        rec.add(seen)
    st = RunStats()
    st.rec = rec
    st.messages = len(acks)
    st.seconds = float(done.get("seconds") or seconds)
    st.items = len(acks)
    lag = rec.summary()
    res = make_result("eventlog.projection_lag", st, dir, unit="append", extra={
        "target_rate": rate,
        "achieved_rate": done.get("rate"),
        "writer_seconds": done.get("seconds"),
        "writer_threads": wthreads,
        "writer_append_ms": done.get("append_ms"),
        "writer_max_behind_schedule_ms": done.get("max_behind_schedule_ms"),
        "lag_ms": lag,
        "acks": len(acks),
        "never_visible": unseen,
        "seen_before_ack": early,
        "poll_ms": poll * 1e3,
        "polls": polls,
        "cursor_steps": len(obs_c),
        "prefill": pre,
        "note": (f"lat = ack -> visible in a follower's projection; msgs/s = paced writer process "
                 f"(target {rate:,.0f}/s, {wthreads} thr)" + (f"; {unseen} never visible" if unseen else "")),
    })
    total_msgs = workload.n_messages + len(acks)
    res["disk_bytes_per_message"] = round(dir_size(dir)["allocated"] / total_msgs, 1) if total_msgs else None
    return res


# ---------------------------------------------------------------------------------------
# scale curve


def scale_point(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """Prefill ``n_messages - probe`` messages with ``append_messages`` batches, then
    ``probe`` single synced ``append_message`` calls (latency at this log size), a
    full ``rebuild()`` and FTS searches."""
    probe = opts.get("probe", 2000)
    size = workload.n_messages - probe
    with _open_store(dir) as s:
        sess = _store_sessions(s)
        t0 = perf()
        for chunk in workload.batch_chunks(100, 10000, stop=size):
            sess.prepare(chunk)
            for sid, msgs in chunk:
                s.append_messages(sess.ids[sid], [msg_kwargs(m) for m in msgs])  # API
        s.sync()  # API
        prefill_s = perf() - t0

        def call(m: dict[str, Any]) -> None:
            s.append_message(sess.ids[m["session_id"]], **msg_kwargs(m))

        st = drive_single(workload.chunks(probe, size, size + probe), call, prepare=sess.prepare)
        s.sync()
        n_sessions = len(sess.ids)
    # The rebuild runs in its own process so its peak RSS (VmHWM) is the rebuild's, not the prefill's.
    rb = _rebuild_in_subprocess(dir)
    rebuild_s = rb["rebuild_s"]
    srec = Recorder()
    with _open_store(dir) as s:
        s.sync()
        for term in workload.search_terms(opts.get("searches", 100)):
            t0 = perf()
            s.search(term)  # API
            srec.add(perf() - t0)
    lat = st.rec.summary()
    sr = srec.summary()
    total = size + st.messages + n_sessions
    res = make_result("eventlog.scale", st, dir, extra={"size": size, "rebuild": rb})
    res["scale"] = scale_record(size, prefill_s, lat, rebuild_s, total,
                                "SessionStore.rebuild() (all projections), in its own process", sr,
                                res["disk_bytes"], size + st.messages,
                                rebuild_events=rb.get("events"), rebuild_peak_rss_mb=rb.get("peak_rss_mb"))
    return res


def _rebuild_in_subprocess(dir: str) -> dict[str, Any]:
    """``python -m bench.rebuild_one``: one full rebuild in a fresh process (see there)."""
    proc = subprocess.run([sys.executable, "-m", "bench.rebuild_one", "--dir", dir, "--profile", PROFILE],
                          capture_output=True, text=True, env=dict(os.environ))
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            rb = json.loads(line)
            if rb.get("ok"):
                return rb
            raise RuntimeError(f"rebuild subprocess failed: {rb.get('error')}")
    raise RuntimeError(f"rebuild subprocess exited {proc.returncode}: {proc.stderr.strip()[-400:]}")


def _jsonable(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    if hasattr(obj, "__dict__"):
        return _jsonable(vars(obj))
    return repr(obj)
