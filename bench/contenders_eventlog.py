"""eventlog contenders.

>>> SLOTS FOR THE LEAD: these are written against the API the design promises and
>>> have not run against a finished eventlog yet.  Every place that assumes a detail
>>> of the API is marked ``# API:``; adjust those lines once the API has landed.

Expected API (DESIGN.md "Public surfaces" and the bench brief)::

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

from pathlib import Path
from typing import Any, Callable, Sequence

from bench.common import Recorder, RunStats, drive_single, drive_threads, make_result, perf

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
        t0 = perf()
        s.rebuild()  # API
        rebuild_s = perf() - t0
        srec = Recorder()
        for term in workload.search_terms(opts.get("searches", 100)):
            t0 = perf()
            s.search(term)  # API
            srec.add(perf() - t0)
        n_sessions = len(sess.ids)
    lat = st.rec.summary()
    sr = srec.summary()
    total = size + st.messages + n_sessions
    res = make_result("eventlog.scale", st, dir, extra={"size": size})
    res["scale"] = {
        "size": size,
        "prefill_s": round(prefill_s, 3),
        "append_p50_ms": lat.get("p50"),
        "append_p99_ms": lat.get("p99"),
        "rebuild_s": round(rebuild_s, 4),
        "rebuild_events_per_s": round(total / rebuild_s, 1) if rebuild_s else None,
        "rebuild_what": "SessionStore.rebuild() (all projections)",
        "search_p50_ms": sr.get("p50"),
        "search_p99_ms": sr.get("p99"),
        "disk_bytes_per_message": round(res["disk_bytes"] / (size + st.messages), 1),
    }
    return res


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
