"""Storage v2 figures (issue 17), side by side in one run on one seeded workload.

    .venv/bin/python -m bench.storage [--messages 20000] [--rebuild-messages 100000] [--rounds 2] [--dir D]

Prints, per message and as ratios against the state.db baseline (``bench.baseline_sqlite``: one
synced SQLite transaction per message, external-content trigram FTS5 kept by triggers):

* disk per message after ordinary appends (``SessionStore.append_messages`` in the workload's
  batches, follower projecting, store closed) and right after a ``rebuild()``, split by file
  (log, state.db, search index, WALs, other) — the issue's target is <= 1.5x the baseline;
* the full rebuild in events/s — the search index built beside state.db (what a rebuild does)
  and, alternating with it in the same process, built after it (``--rounds`` of each) — with
  CPU seconds and the state.db phase alone (``list_sessions`` answers from then on; search
  reports ``degraded`` until the index is in); a bare ``executemany`` of the very rows that
  rebuild produced, into the same schema with the same bulk pragmas (rows read back outside
  the clock), and a bare index build from them (one ``INSERT … SELECT``): together the
  SQLite-only floor of a rebuild; time until ``list_sessions`` answers after state.db is
  deleted vs the full rebuild;
* search p50/p99 over the workload's search terms on the rebuilt store;
* peak RSS of the rebuild (a fresh process: ``bench.rebuild_one``).

Nothing is asserted: the figures and their targets are printed (PASS/MISS) for bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import baseline_sqlite
from bench.contenders_eventlog import _populate_log, msg_kwargs
from bench.workload import Workload

PROFILE = "bench"


def _breakdown(home: Path) -> dict[str, int]:
    """Allocated bytes under ``home`` by kind of file."""
    out = {"log": 0, "state": 0, "index": 0, "wal": 0, "other": 0}
    for root, _dirs, names in os.walk(home):
        for name in names:
            p = Path(root) / name
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            size = st.st_blocks * 512
            rel = p.relative_to(home).as_posix()
            if "/log/" in rel:
                kind = "log"
            elif name.endswith(("-wal", "-shm")):
                kind = "wal"
            elif name.startswith("state.") and name.endswith(".db"):
                kind = "state"
            elif name.startswith("fts.") and name.endswith(".db"):
                kind = "index"
            else:
                kind = "other"
            out[kind] += size
    out["total"] = sum(out.values())
    return out


def _per_message(b: dict[str, int], n: int) -> dict[str, float]:
    return {k: round(v / n, 1) for k, v in b.items()}


def eventlog_appends(work: Workload, home: Path) -> dict[str, Any]:
    from eventlog import SessionStore

    ids: dict[str, str] = {}
    t0 = time.perf_counter()
    with SessionStore.open(home=home, profile=PROFILE, follower=True) as s:
        for wsid, msgs in work.batches(100):
            sid = ids.get(wsid)
            if sid is None:
                sid = ids[wsid] = s.create_session(source="bench")
            s.append_messages(sid, [msg_kwargs(m) for m in msgs])
        s.sync(timeout=600)
    return {"seconds": round(time.perf_counter() - t0, 2), "sessions": len(ids)}


def baseline(work: Workload, directory: Path) -> dict[str, Any]:
    res = baseline_sqlite.single(work, str(directory))
    alloc = sum(p.stat().st_blocks * 512 for p in directory.iterdir() if p.is_file())
    return {"bytes_per_message": round(alloc / work.n_messages, 1), "msgs_per_s": res.get("msgs_per_s"),
            "wal_left_behind_bytes": res.get("extra", {}).get("wal_left_behind_bytes")}


def bare_executemany(state_db: Path, scratch: Path) -> dict[str, Any]:
    """Insert the rows of a built state.db into an empty file of the same schema with the
    builder's bulk pragmas: the floor under the Applier. Rows are read before the clock."""
    from projections.build import bulk_pragmas
    from projections.schema import STATE_DDL

    src = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True)
    sessions = src.execute("SELECT * FROM sessions").fetchall()
    messages = src.execute("SELECT * FROM messages ORDER BY id").fetchall()
    src.close()
    out = sqlite3.connect(scratch, isolation_level=None)
    bulk_pragmas(out)
    for stmt in STATE_DDL:
        out.execute(stmt)
    t0 = time.perf_counter()
    out.execute("BEGIN")
    for i in range(0, len(messages), 5000):
        chunk = messages[i:i + 5000]
        out.executemany(f"INSERT INTO messages VALUES ({', '.join('?' * len(chunk[0]))})", chunk)
    out.executemany(f"INSERT INTO sessions VALUES ({', '.join('?' * len(sessions[0]))})", sessions)
    out.execute("COMMIT")
    out.close()
    fd = os.open(scratch, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    seconds = time.perf_counter() - t0
    events = len(sessions) + len(messages)
    return {"seconds": round(seconds, 3), "events": events, "events_per_s": round(events / seconds),
            "index_seconds": round(bare_index(scratch, scratch.with_name("bare-index.db")), 3)}


def bare_index(state_db: Path, out_path: Path) -> float:
    """Seconds to build the search index of ``state_db``'s messages in one ``INSERT … SELECT``
    (the builder's own statement and settings, no Python per row): SQLite's share of a rebuild's
    index. With :func:`bare_executemany` it is the SQLite-only floor of a rebuild."""
    from projections import fts
    from projections.build import bulk_pragmas, create
    from projections.schema import FTS_APP_ID, FTS_DDL, FTS_SCHEMA

    out = sqlite3.connect(out_path, isolation_level=None)
    bulk_pragmas(out)
    create(out, FTS_APP_ID, FTS_SCHEMA, FTS_DDL)
    fts.register(out)
    out.execute("ATTACH DATABASE ? AS s", (f"file:{state_db}?mode=ro",))
    t0 = time.perf_counter()
    out.execute("BEGIN")
    fts.build_from_state(out, fts_schema="main", state_schema="s")
    out.execute("COMMIT")
    out.close()
    return time.perf_counter() - t0


def _timed_rebuild(p: Any, beside: bool) -> dict[str, Any]:
    """One full ``rebuild("all")``, the index built beside state.db or after it; the moment
    state.db is swapped in (list_sessions answers from there) is noted by a thread watching
    the pointer."""
    from projections import build, files

    before = files.read_pointer(p.state_pointer())
    swapped: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if files.read_pointer(p.state_pointer()) != before:
                swapped.append(time.perf_counter())
                return
            time.sleep(0.002)

    saved = build.INDEX_BESIDE
    build.INDEX_BESIDE = beside
    w = threading.Thread(target=watch)
    w.start()
    c0 = _cpu()
    t0 = time.perf_counter()
    try:
        stats = p.rebuild("all")
    finally:
        build.INDEX_BESIDE = saved
    total = time.perf_counter() - t0
    cpu = _cpu() - c0
    stop.set()
    w.join()
    state_s = (swapped[0] - t0) if swapped else None
    return {"events": stats["events"], "seconds": round(total, 3), "events_per_s": round(stats["events"] / total),
            "state_phase_s": round(state_s, 3) if state_s else None, "cpu_s": round(cpu, 2)}


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rebuild_phases(home: Path, rounds: int = 2) -> dict[str, Any]:
    """Full rebuilds, the index beside state.db (what a rebuild does) and after it, alternating,
    ``rounds`` of each (the median by time is reported); then the time until list_sessions
    answers after state.db is deleted."""
    from eventlog import SessionStore
    from projections import files

    out: dict[str, Any] = {}
    with SessionStore.open(home=home, profile=PROFILE, follower=False) as s:
        p = s._projector
        assert p is not None
        runs: dict[str, list[dict[str, Any]]] = {"beside": [], "after": []}
        for _ in range(rounds):
            runs["beside"].append(_timed_rebuild(p, True))
            runs["after"].append(_timed_rebuild(p, False))
        for name, rs in runs.items():
            out["full" if name == "beside" else "full_index_after"] = sorted(rs, key=lambda r: r["seconds"])[(len(rs) - 1) // 2]
        out["runs"] = runs
        searches = []
        for term in Workload(20000).search_terms(100):
            t1 = time.perf_counter()
            s.search(term)
            searches.append((time.perf_counter() - t1) * 1000)
        q = statistics.quantiles(searches, n=100)
        out["search_ms"] = {"p50": round(statistics.median(searches), 2), "p99": round(q[98], 2),
                            "max": round(max(searches), 2)}
    # state.db deleted: the next open rebuilds it; time until list_sessions answers.
    prof = home / "profiles" / PROFILE
    g = files.read_pointer(prof / "state.db")
    assert g is not None
    os.unlink(prof / "state.db")
    files.remove_file(g.path)
    t0 = time.perf_counter()
    with SessionStore.open(home=home, profile=PROFILE, follower=False) as s:
        s.list_sessions(limit=50)
        listed = time.perf_counter() - t0
        degraded = s.search("session")["degraded"]
    out["after_delete"] = {"list_sessions_s": round(listed, 3), "search_degraded_then": degraded}
    return out


def rebuild_rss(home: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "bench.rebuild_one", "--dir", str(home), "--profile", PROFILE],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    r = json.loads(line)
    return {"peak_rss_mb": r.get("peak_rss_mb"), "peak_anon_mb": r.get("peak_anon_mb"),
            "events_per_s": r.get("events_per_s")}


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.storage")
    ap.add_argument("--messages", type=int, default=20000, help="disk figures (default 20000)")
    ap.add_argument("--rebuild-messages", type=int, default=100000, help="rebuild figures (default 100000)")
    ap.add_argument("--dir", default=None, help="scratch directory on a real disk (default: a temp dir)")
    ap.add_argument("--rounds", type=int, default=2, help="full rebuilds of each kind (default 2)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    top = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=args.dir))
    res: dict[str, Any] = {"messages": args.messages, "rebuild_messages": args.rebuild_messages}
    try:
        work = Workload(args.messages)
        base_dir = top / "baseline"
        base_dir.mkdir()
        res["baseline"] = baseline(work, base_dir)
        home = top / "eventlog"
        res["appends"] = eventlog_appends(work, home)
        res["disk_steady"] = _per_message(_breakdown(home), args.messages)
        from eventlog import SessionStore

        with SessionStore.open(home=home, profile=PROFILE, follower=False) as s:
            s.rebuild()
        res["disk_after_rebuild"] = _per_message(_breakdown(home), args.messages)

        big = top / "rebuild"
        events, populate_s = _populate_log(Workload(args.rebuild_messages), str(big))
        with SessionStore.open(home=big, profile=PROFILE, follower=False) as s:
            s.sync(timeout=3600)
        res["rebuild"] = rebuild_phases(big, args.rounds)
        from projections import files

        g = files.read_pointer(big / "profiles" / PROFILE / "state.db")
        assert g is not None
        res["bare"] = bare_executemany(g.path, top / "bare.db")
        res["rss"] = rebuild_rss(big)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    base = res["baseline"]["bytes_per_message"]
    full, after, bare = res["rebuild"]["full"], res["rebuild"]["full_index_after"], res["bare"]
    floor_seq = round(bare["events"] / (bare["seconds"] + bare["index_seconds"]))
    floor_par = round(bare["events"] / max(bare["seconds"], bare["index_seconds"]))
    rows = [
        ("disk per message, after appends", f"{res['disk_steady']['total']:.0f} B",
         f"{res['disk_steady']['total'] / base:.2f}x baseline ({base:.0f} B)",
         verdict(res["disk_steady"]["total"] <= 1.5 * base)),
        ("disk per message, after a rebuild", f"{res['disk_after_rebuild']['total']:.0f} B",
         f"{res['disk_after_rebuild']['total'] / base:.2f}x baseline",
         verdict(res["disk_after_rebuild"]["total"] <= 1.5 * base)),
        ("full rebuild events/s (index beside state.db)", f"{full['events_per_s']:,}", "target >= 30,000",
         verdict(full["events_per_s"] >= 30000)),
        ("the same, index built after state.db", f"{after['events_per_s']:,}",
         f"beside / after {full['events_per_s'] / after['events_per_s']:.2f}x (cpu {full['cpu_s']} / "
         f"{after['cpu_s']} s)", ""),
        ("SQLite alone: state rows + index, in sequence", f"{floor_seq:,} events/s",
         f"beside: {floor_par:,} (rows {bare['seconds']} s, index {bare['index_seconds']} s)", "ceiling"),
        ("full rebuild vs bare executemany of its rows", f"{full['events_per_s']:,} / {bare['events_per_s']:,}",
         f"{full['events_per_s'] / bare['events_per_s']:.2f}x (target >= 0.5x)",
         verdict(full["events_per_s"] >= 0.5 * bare["events_per_s"])),
        ("state.db phase of the rebuild", f"{full['state_phase_s']} s of {full['seconds']} s",
         f"{full['state_phase_s'] / full['seconds']:.2f} of the rebuild (target <= 1/3)",
         verdict(full["state_phase_s"] / full["seconds"] <= 1 / 3)),
        ("list_sessions after state.db deleted", f"{res['rebuild']['after_delete']['list_sessions_s']} s",
         f"{res['rebuild']['after_delete']['list_sessions_s'] / full['seconds']:.2f} of the full rebuild", ""),
        ("search p50 / p99 ms", f"{res['rebuild']['search_ms']['p50']} / {res['rebuild']['search_ms']['p99']}",
         "", ""),
        ("peak RSS of the rebuild", f"{res['rss']['peak_rss_mb']} MB (anon {res['rss']['peak_anon_mb']} MB)",
         "target <= 200 MB", verdict((res["rss"]["peak_rss_mb"] or 1e9) <= 200)),
    ]
    print(f"bench.storage: {args.messages:,} messages for disk, {args.rebuild_messages:,} for the rebuild")
    for name, value, ratio, v in rows:
        print(f"  {name:<46} {value:<28} {ratio:<48} {v}")
    print("  disk after appends, bytes/message:", res["disk_steady"])
    print("  disk after rebuild, bytes/message:", res["disk_after_rebuild"])
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
