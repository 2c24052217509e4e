"""eventlog benchmark: eventlog side by side with what a user would pick instead.

    python -m bench                       # 100,000 messages, every contender
    python -m bench --scale               # ... plus the 10k / 100k / 1M scale curve (PNG)
    python -m bench --quick               # tiny sizes, a smoke test (~1 min)
    python -m bench --only baseline_sqlite,floor --messages 20000

Each contender runs in its own subprocess (``python -m bench.run_one``) on the
same seeded workload, in a fresh directory, so peak RSS and on-disk size are its
own.  Results are printed as tables with ratios and the targets of the issues
(PASS / MISS / N/A), written as JSON (``--out``), as Markdown beside it (for the
README), and the scale curve as ``scale.png`` beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RATIO_HEADERS,
    RESULT_HEADERS,
    compare,
    environment,
    fs_type,
    plot_scale,
    ratio_rows,
    render_markdown,
    render_table,
    result_rows,
    write_json,
)
from bench.registry import Contender, select
from bench.workload import DEFAULT_SEED, Workload

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "bench/results/latest.json"
SCALE_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SCALE_SIZES = (1_000, 4_000)

# eventlog contender  vs  what it is compared with
COMPARISONS: list[tuple[str, str]] = [
    ("eventlog.single_synced", "baseline_sqlite.single"),
    ("eventlog.single_synced", "baseline_es.single"),
    ("eventlog.single_synced", "floor.lmdb_single"),
    ("eventlog.threads8", "baseline_sqlite.threads8"),
    ("eventlog.threads8", "baseline_es.threads8"),
    ("eventlog.threads8", "floor.lmdb_threads8"),
    ("eventlog.threads8", "eventlog.single_synced"),
    ("eventlog.batch100", "baseline_es.batch100"),
    ("eventlog.batch100", "floor.lmdb_batch100"),
    ("eventlog.log_bare", "floor.lmdb_single"),
    ("eventlog.log_bare_threads8", "floor.lmdb_threads8"),
    ("eventlog.log_bare_threads8", "eventlog.log_bare"),
    ("eventlog.log_bare_batch100", "floor.lmdb_batch100"),
    ("postgres.paired8", "postgres.es_threads8"),
    ("postgres.two_hosts", "postgres.paired8"),
]
# context: how far the baselines are from the floor
CONTEXT: list[tuple[str, str]] = [
    ("baseline_sqlite.single", "floor.lmdb_single"),
    ("baseline_sqlite.threads8", "floor.lmdb_threads8"),
    ("baseline_es.single", "floor.lmdb_single"),
    ("baseline_es.threads8", "floor.lmdb_threads8"),
    ("baseline_es.batch100", "floor.lmdb_batch100"),
    ("floor.file_fsync", "floor.lmdb_single"),
    ("floor.lmdb_group8", "eventlog.log_bare"),
    ("floor.lmdb_group8", "floor.lmdb_single"),
    ("floor.lmdb4_group8", "eventlog.log_bare"),
    ("floor.lmdb4_single", "floor.lmdb_single"),
    ("eventlog.log_bare", "floor.lmdb4_single"),
]


# ---------------------------------------------------------------------------------------
# running


def run_contender(c: Contender, messages: int, args: argparse.Namespace, tmp_root: Path) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix=c.name.replace(".", "-") + "-", dir=tmp_root))
    cmd = [sys.executable, "-m", "bench.run_one", c.name, "--messages", str(messages), "--dir", str(d),
           "--seed", str(args.seed), "--threads", str(args.threads), "--chunk", str(args.chunk),
           "--probe", str(args.probe), "--searches", str(args.searches), "--samples", str(args.samples),
           "--writer-threads", str(args.writer_threads), "--lag-rate", str(args.lag_rate),
           "--lag-seconds", str(args.lag_seconds)]
    if args.budget:
        cmd += ["--budget", str(args.budget)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    res: dict[str, Any] | None = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                res = json.loads(line)
                break
            except ValueError:
                pass
    if res is None:
        tail = (proc.stderr or "").strip().splitlines()[-6:]
        res = {"name": c.name, "ok": False, "kind": c.kind,
               "error": f"run_one exited {proc.returncode} without a result: " + " | ".join(tail)}
    elif not res.get("ok") and not res.get("unavailable"):
        res.setdefault("stderr_tail", (proc.stderr or "").strip().splitlines()[-8:])
    res["subprocess_s"] = round(time.time() - t0, 2)
    if args.keep:
        res["dir"] = str(d)
    else:
        shutil.rmtree(d, ignore_errors=True)
    return res


def progress(i: int, n: int, name: str, res: dict[str, Any], extra: str = "") -> None:
    if res.get("ok"):
        lat = res.get("latency_ms", {})
        msg = (f"{res.get('messages_per_s') or 0:>10,.0f} msgs/s  p50 {lat.get('p50', 0):.3f} ms  "
               f"p99 {lat.get('p99', 0):.3f} ms  RSS {res.get('peak_rss_mb')} MB")
    elif res.get("unavailable"):
        msg = str(res.get("error"))[:120]
    else:
        msg = "FAILED: " + str(res.get("error"))[:160]
    print(f"[{i}/{n}] {name:<32}{extra} {msg}  ({res.get('subprocess_s', 0):.1f} s)", flush=True)


# ---------------------------------------------------------------------------------------
# targets


def _ok(results: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    r = results.get(name)
    return r if r and r.get("ok") else None


def _target(issue: int, text: str, value: float | None, threshold: float, higher_is_better: bool,
            detail: str, unit: str = "x") -> dict[str, Any]:
    if value is None:
        status = "N/A"
    elif higher_is_better:
        status = "PASS" if value >= threshold else "MISS"
    else:
        status = "PASS" if value <= threshold else "MISS"
    return {"issue": issue, "target": text, "value": value, "threshold": threshold, "unit": unit,
            "status": status, "detail": detail, "higher_is_better": higher_is_better}


def _context(row: dict[str, Any]) -> dict[str, Any]:
    """A measured bound printed beside the targets (status ``info``: above or below the threshold
    a target would need), so a MISS can be read against what the machine allows."""
    if row["status"] != "N/A":
        ok = row["status"] == "PASS"
        row["status"] = "info " + (("(>=)" if ok else "(<)") if row["higher_is_better"] else ("(<=)" if ok else "(>)"))
    return row


def _first_ok(results: dict[str, dict[str, Any]], *names: str) -> tuple[str, dict[str, Any]] | tuple[None, None]:
    for n in names:
        r = _ok(results, n)
        if r:
            return n, r
    return None, None


def evaluate_targets(results: dict[str, dict[str, Any]], scale: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    def rate(n: str) -> float | None:
        r = _ok(results, n)
        return r.get("messages_per_s") if r else None

    def lat(n: str, q: str) -> float | None:
        r = _ok(results, n)
        return r["latency_ms"].get(q) if r else None

    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    t: list[dict[str, Any]] = []
    el8, a8 = rate("eventlog.threads8"), rate("baseline_sqlite.threads8")
    t.append(_target(7, "8-writer durable append throughput >= 10x baseline A (8 threads)", div(el8, a8), 10, True,
                     f"eventlog.threads8 {el8} msgs/s vs baseline_sqlite.threads8 {a8} msgs/s"))
    bname, _b = _first_ok(results, "baseline_es.threads8", "baseline_es.single")
    b8 = rate(bname) if bname else None
    t.append(_target(7, "8-writer durable append throughput >= 10x baseline B", div(el8, b8), 10, True,
                     f"eventlog.threads8 {el8} msgs/s vs {bname} {b8} msgs/s"))
    p99 = lat("eventlog.threads8", "p99")
    t.append(_target(7, "p99 append latency under 8 writers <= 2 ms", p99, 2.0, False,
                     "eventlog.threads8 p99", unit="ms"))
    e50, a50 = lat("eventlog.single_synced", "p50"), lat("baseline_sqlite.single", "p50")
    t.append(_target(7, "single durable append p50 <= baseline A's", div(e50, a50), 1.0, False,
                     f"eventlog.single_synced p50 {e50} ms vs baseline_sqlite.single p50 {a50} ms"))
    cr = _ok(results, "eventlog.catchup_and_rebuild")
    rb = cr["extra"].get("rebuild_events_per_s") if cr else None
    t.append(_target(7, "full rebuild >= 100k events/s", rb, 100_000, True,
                     "eventlog.catchup_and_rebuild rebuild rate", unit="events/s"))
    pts = sorted((p for p in scale.get("eventlog.scale", []) if p.get("append_p50_ms") is not None),
                 key=lambda p: p["size"])
    if len(pts) >= 2:
        lo, hi = pts[0], pts[-1]
        v = div(hi["append_p50_ms"], lo["append_p50_ms"])
        note = "" if hi["size"] >= 1_000_000 else f" (largest size run: {hi['size']:,}, not 1M)"
        detail = (f"append p50 {hi['append_p50_ms']} ms at {hi['size']:,} vs {lo['append_p50_ms']} ms "
                  f"at {lo['size']:,}{note}")
    else:
        v, detail = None, "needs --scale (eventlog.scale at >= 2 sizes)"
    t.append(_target(7, "append latency at 1M events within 1.2x of that at 10k", v, 1.2, False, detail))

    # issue 2: the log itself
    for single, threads, what in (("eventlog.log_bare", "eventlog.log_bare_threads8", "EventLog"),
                                  ("eventlog.single_synced", "eventlog.threads8", "SessionStore")):
        s1, s8 = rate(single), rate(threads)
        t.append(_target(2, f"8-thread group commit >= 10x single-thread synced rate ({what})", div(s8, s1), 10, True,
                         f"{threads} {s8} msgs/s vs {single} {s1} msgs/s"))
    g8, s1 = rate("floor.lmdb_group8"), rate("eventlog.log_bare")
    t.append(_context(_target(2, "context, not a target: ceiling of any 8-caller group commit (bare LMDB, 8 events "
                        "per synced commit, one thread) / EventLog single rate; the 10x above needs this >= 10",
                     div(g8, s1), 10, True, f"floor.lmdb_group8 {g8} msgs/s vs eventlog.log_bare {s1} msgs/s")))
    g48 = rate("floor.lmdb4_group8")
    t.append(_context(_target(2, "context, not a target: the same ceiling on eventlog's four B-trees "
                        "(floor.lmdb4_group8) / EventLog single rate",
                     div(g48, s1), 10, True, f"floor.lmdb4_group8 {g48} msgs/s vs eventlog.log_bare {s1} msgs/s")))
    pr = _ok(results, "eventlog.log_paired")
    if pr:
        px = pr["extra"]
        pf = px["floor_latency_ms"]
        t.append(_target(2, "single synced append p50 <= 1.5x bare LMDB put (same process, interleaved blocks)",
                         px.get("p50_vs_lmdb_single"), 1.5, False,
                         f"eventlog.log_paired p50 {pr['latency_ms'].get('p50')} ms vs its bare put p50 "
                         f"{pf['lmdb_single'].get('p50')} ms ({pr['calls']:,} calls each, blocks of {px['block']})"))
        t.append(_context(_target(2, "context, not a target: the bare put on eventlog's four B-trees / the bare put "
                                     "(same process): the layout's share of the 1.5x",
                                  px.get("lmdb4_vs_lmdb_single_p50"), 1.5, False,
                                  f"{pf['lmdb4_single'].get('p50')} ms vs {pf['lmdb_single'].get('p50')} ms")))
    l50, f50 = lat("eventlog.log_bare", "p50"), lat("floor.lmdb_single", "p50")
    t.append(_target(2, "single synced append p50 <= 1.5x bare LMDB put (separate processes, minutes apart)",
                     div(l50, f50), 1.5, False,
                     f"eventlog.log_bare p50 {l50} ms vs floor.lmdb_single p50 {f50} ms"))
    f450 = lat("floor.lmdb4_single", "p50")
    t.append(_context(_target(2, "context, not a target: the same bare put on eventlog's four B-trees "
                                 "(floor.lmdb4_single) / floor.lmdb_single p50: the layout's share of the 1.5x",
                              div(f450, f50), 1.5, False,
                              f"floor.lmdb4_single p50 {f450} ms vs floor.lmdb_single p50 {f50} ms")))
    t.extend(issue4_targets(results, scale))
    from bench.postgres import issue19_targets

    t.extend(issue19_targets(results, _target))
    return t


def _largest(points: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    pts = [p for p in points if p.get(key) is not None]
    return max(pts, key=lambda p: p["size"]) if pts else None


def _size_note(size: int) -> str:
    return "" if size >= 1_000_000 else f" (largest size run: {size:,}, not 1M)"


def issue4_targets(results: dict[str, dict[str, Any]], scale: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Issue 4 (projections) figures: reads under a writer, projection lag, and at the largest
    scale size: rebuild rate, rebuild vs the bare insert+FTS rebuild, search p50, rebuild RSS."""
    t: list[dict[str, Any]] = []
    r = _ok(results, "eventlog.readers_under_load")
    if r:
        ex = r["extra"]
        live = ex.get("list_long_lived_ms", {})
        w = ex.get("writer", {})
        v = r["latency_ms"].get("p99")
        detail = (f"open+list(50)+close p50 {r['latency_ms'].get('p50')} ms over {ex.get('samples')} samples; "
                  f"long-lived list(50) p50 {live.get('p50')} / p99 {live.get('p99')} ms; writer "
                  f"{ex.get('writer_threads')} thr appended {r.get('messages'):,} meanwhile "
                  f"({w.get('rate')} appends/s, append p50 {w.get('append_ms', {}).get('p50')} ms)")
    else:
        v, detail = None, "needs eventlog.readers_under_load"
    t.append(_target(4, "read-only open + list_sessions(50) p99 while another process appends at full speed <= 20 ms",
                     v, 20.0, False, detail, unit="ms"))
    r = _ok(results, "eventlog.projection_lag")
    if r:
        ex = r["extra"]
        v = r["latency_ms"].get("p99")
        detail = (f"lag p50 {r['latency_ms'].get('p50')} / max {r['latency_ms'].get('max')} ms over {ex.get('acks'):,} "
                  f"appends; writer {ex.get('achieved_rate')} appends/s (target {ex.get('target_rate'):,.0f}), "
                  f"reader SessionStore(follower=True), cursor polled every {ex.get('poll_ms')} ms"
                  + (f"; {ex['never_visible']} never visible" if ex.get("never_visible") else ""))
    else:
        v, detail = None, "needs eventlog.projection_lag"
    t.append(_target(4, "projection lag p99 at 1,000 appends/s <= 100 ms", v, 100.0, False, detail, unit="ms"))

    el = scale.get("eventlog.scale", [])
    bare = scale.get("baseline_bare_rebuild.scale", [])
    p = _largest(el, "rebuild_events_per_s")
    if p:
        v, detail = p["rebuild_events_per_s"], f"eventlog.scale rebuild at {p['size']:,}{_size_note(p['size'])}"
    else:
        v, detail = None, "needs --scale (eventlog.scale)"
    t.append(_target(4, "full rebuild of state.db + FTS for 1M messages >= 100k events/s", v, 100_000, True,
                     detail, unit="events/s"))
    common = sorted({q["size"] for q in el if q.get("rebuild_events_per_s")}
                    & {q["size"] for q in bare if q.get("rebuild_events_per_s")})
    if common:
        size = common[-1]
        e = next(q for q in el if q["size"] == size)
        b = next(q for q in bare if q["size"] == size)
        v = round(e["rebuild_events_per_s"] / b["rebuild_events_per_s"], 3)
        detail = (f"at {size:,}: eventlog rebuild {e['rebuild_events_per_s']:,.0f} ev/s ({e['rebuild_s']} s) vs bare "
                  f"insert+FTS rebuild {b['rebuild_events_per_s']:,.0f} ev/s ({b['rebuild_s']} s){_size_note(size)}")
    else:
        v, detail = None, "needs --scale with eventlog.scale and baseline_bare_rebuild.scale at a common size"
    t.append(_target(4, "full rebuild >= 0.8x bare 'insert the same rows, then FTS rebuild'", v, 0.8, True, detail))
    bp = _largest(bare, "insert_s")
    if bp and bp.get("insert_s") and bp.get("fts_rebuild_s"):
        ev = bp["rebuild_events"]
        for what, secs in (("executemany of the rows alone (no FTS)", bp["insert_s"]),
                           ("FTS5 'rebuild' alone", bp["fts_rebuild_s"])):
            t.append(_context(_target(4, f"context, not a target: bare {what}, events/s; the 100k rebuild needs this >= 100k",
                             round(ev / secs, 1), 100_000, True,
                             f"baseline_bare_rebuild.scale at {bp['size']:,}: {ev:,} events in {secs} s"
                             f"{_size_note(bp['size'])}", unit="events/s")))
    p = _largest(el, "search_p50_ms")
    if p:
        v = p["search_p50_ms"]
        detail = f"eventlog.scale at {p['size']:,} (p99 {p.get('search_p99_ms')} ms){_size_note(p['size'])}"
    else:
        v, detail = None, "needs --scale (eventlog.scale)"
    t.append(_target(4, "FTS search p50 at 1M messages <= 10 ms", v, 10.0, False, detail, unit="ms"))
    p = _largest(el, "rebuild_peak_rss_mb")
    if p:
        v = p["rebuild_peak_rss_mb"]
        detail = f"VmHWM of the rebuild's own process at {p['size']:,}{_size_note(p['size'])}"
    else:
        v, detail = None, "needs --scale (eventlog.scale)"
    t.append(_target(4, "peak RSS of the 1M rebuild <= 200 MB", v, 200.0, False, detail, unit="MB"))
    return t


def target_rows(targets: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for t in targets:
        v = t["value"]
        if v is None:
            vs = "-"
        elif t["unit"] == "x":
            vs = f"{v:.2f}x"
        elif t["unit"] == "ms":
            vs = f"{v:.3f} ms"
        elif t["unit"] == "MB":
            vs = f"{v:,.1f} MB"
        else:
            vs = f"{v:,.0f} {t['unit']}"
        rows.append([t["status"], f"#{t['issue']}", t["target"], vs, t["detail"]])
    return rows


TARGET_HEADERS = ("status", "issue", "target", "value", "measured")

SCALE_HEADERS = ("contender", "events", "append p50 ms", "append p99 ms", "rebuild s", "rebuild ev/s",
                 "rebuild RSS MB", "search p50 ms", "search p99 ms", "disk B/msg", "prefill s")


def scale_rows(scale: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    rows = []
    for name, pts in scale.items():
        for p in sorted(pts, key=lambda p: p["size"]):
            rows.append([name, p["size"], p.get("append_p50_ms"), p.get("append_p99_ms"), p.get("rebuild_s"),
                         p.get("rebuild_events_per_s"), p.get("rebuild_peak_rss_mb"), p.get("search_p50_ms"),
                         p.get("search_p99_ms"),
                         p.get("disk_bytes_per_message"), p.get("prefill_s")])
    return rows


# ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=None, help="messages per contender (default 100000; --quick: 1500)")
    ap.add_argument("--scale", action="store_true", help="also run the scale curve (10k, 100k, 1M events)")
    ap.add_argument("--scale-sizes", default=None, help="comma-separated sizes for --scale (overrides the default)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the whole pipeline")
    ap.add_argument("--only", default=None, help="comma-separated contenders or groups "
                    "(eventlog, baseline_sqlite, baseline_es, floor, postgres, baseline_bare_rebuild (scale only), "
                    "or names like eventlog.log_bare)")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT}); .md and scale.png beside it")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds per contender before it stops early and reports a partial run (default 600; 0 = none)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=5000, help="messages materialised per untimed chunk")
    ap.add_argument("--probe", type=int, default=None, help="scale: timed single appends per point (default 2000)")
    ap.add_argument("--searches", type=int, default=None, help="search queries timed (default 100)")
    ap.add_argument("--samples", type=int, default=None,
                    help="readers_under_load: samples per phase (default 500; --quick: 100)")
    ap.add_argument("--writer-threads", type=int, default=4,
                    help="readers_under_load: threads of the full-speed writer process (default 4)")
    ap.add_argument("--lag-rate", type=float, default=1000.0, help="projection_lag: appends/s (default 1000)")
    ap.add_argument("--lag-seconds", type=float, default=None,
                    help="projection_lag: seconds the paced writer runs (default 10; --quick: 3)")
    ap.add_argument("--tmpdir", default=None, help="where contenders write (default: the system temp dir); "
                    "must be a real disk, not tmpfs, or fsync is free")
    ap.add_argument("--keep", action="store_true", help="keep the contenders' directories")
    args = ap.parse_args(argv)
    if args.messages is None:
        args.messages = 1500 if args.quick else 100_000
    if args.budget is None:
        args.budget = 0.0 if args.quick else 600.0
    if args.probe is None:
        args.probe = 200 if args.quick else 2000
    if args.searches is None:
        args.searches = 30 if args.quick else 100
    if args.samples is None:
        args.samples = 100 if args.quick else 500
    if args.lag_seconds is None:
        args.lag_seconds = 3.0 if args.quick else 10.0
    if args.scale_sizes:
        args.sizes = [int(s.replace("_", "")) for s in args.scale_sizes.split(",") if s.strip()]
    else:
        args.sizes = list(QUICK_SCALE_SIZES if args.quick else SCALE_SIZES)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = select(args.only, "run")
        scales = select(args.only, "scale") if args.scale else []
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not runs and not scales:
        print("nothing selected", file=sys.stderr)
        return 2

    tmp_parent = args.tmpdir or tempfile.gettempdir()
    kind = fs_type(tmp_parent)
    if kind in ("tmpfs", "ramfs"):
        alt = "/var/tmp"
        print(f"note: {tmp_parent} is {kind} (fsync is free there); using {alt}")
        tmp_parent, kind = alt, fs_type(alt)
    tmp_root = Path(tempfile.mkdtemp(prefix="eventlog-bench-", dir=tmp_parent))

    out = Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    env = environment()
    env["bench_fs"] = kind
    print(f"eventlog bench: {args.messages:,} messages, seed {args.seed}, {len(runs)} contenders"
          + (f", scale {','.join(f'{s:,}' for s in args.sizes)}" if scales else "")
          + f"\nmachine: {env.get('cpu')} x{env.get('cpus')}, {env.get('mem_gib')} GiB, {env.get('platform')}, "
          f"fs {kind}; python {env['python']}, sqlite {env['sqlite']}, lmdb {env.get('lmdb')} "
          f"(liblmdb {env.get('liblmdb')}), eventsourcing {env.get('eventsourcing')}", flush=True)
    wl = Workload(args.messages, seed=args.seed).describe()
    print(f"workload: {wl['sessions']:,} sessions, roles {wl['roles']}, content bytes {wl['content_bytes']}, "
          f"tool-call share {wl['assistant_with_tool_calls_share']}, reasoning share {wl['with_reasoning_share']}",
          flush=True)

    results: dict[str, dict[str, Any]] = {}
    scale: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    try:
        for i, c in enumerate(runs, 1):
            res = run_contender(c, args.messages, args, tmp_root)
            results[c.name] = res
            progress(i, len(runs), c.name, res)
        n_scale = len(scales) * len(args.sizes)
        k = 0
        for size in args.sizes:
            for c in scales:
                k += 1
                res = run_contender(c, size, args, tmp_root)
                progress(k, n_scale, c.name, res, extra=f" @{size:>9,}")
                if res.get("ok") and res.get("scale"):
                    scale.setdefault(c.name, []).append(res["scale"])
                else:
                    scale.setdefault(c.name, [])
                    results[f"{c.name}@{size}"] = res
    finally:
        if not args.keep:
            shutil.rmtree(tmp_root, ignore_errors=True)

    ran = {k: v for k, v in results.items() if v.get("kind", "run") == "run"}
    ratios = compare(ran, COMPARISONS)
    context = compare(ran, CONTEXT)
    targets = evaluate_targets(ran, scale)

    print()
    print(render_table(RESULT_HEADERS, result_rows(ran), align="lrrrrrrrl"))
    if ratios:
        print("\neventlog / each baseline (msgs/s: higher is better; p50, p99, RSS, disk: lower is better)")
        print(render_table(RATIO_HEADERS, ratio_rows(ratios), align="llrrrrr"))
    if context:
        print("\ncontext: baselines / the floor")
        print(render_table(RATIO_HEADERS, ratio_rows(context), align="llrrrrr"))
    if scale:
        print("\nscale curve")
        print(render_table(SCALE_HEADERS, scale_rows(scale)))
    print("\ntargets")
    print(render_table(TARGET_HEADERS, target_rows(targets), align="lllrl"))

    png = None
    if scale:
        png = plot_scale(scale, out.with_name("scale.png"),
                         title=f"eventlog bench scale curve - {env.get('cpu')} x{env.get('cpus')}, {kind}, "
                               f"{env['date']}")
        if png:
            print(f"\nscale curve: {png}")
    doc = {
        "meta": {"env": env, "args": {k: v for k, v in vars(args).items()}, "workload": wl,
                 "total_s": round(time.time() - started, 1)},
        "results": results,
        "ratios": ratios,
        "context": context,
        "scale": scale,
        "scale_png": png,
        "targets": targets,
    }
    write_json(out, doc)
    md = [f"Machine: {env.get('cpu')} x{env.get('cpus')}, {env.get('mem_gib')} GiB RAM, {kind}; "
          f"Python {env['python']}, SQLite {env['sqlite']}, py-lmdb {env.get('lmdb')}, "
          f"eventsourcing {env.get('eventsourcing')}; {env['date']}. "
          f"Workload: {args.messages:,} messages, {wl['sessions']:,} sessions, seed {args.seed}.",
          "", render_markdown(RESULT_HEADERS, result_rows(ran))]
    if ratios:
        md += ["", "Ratios eventlog / baseline:", "", render_markdown(RATIO_HEADERS, ratio_rows(ratios))]
    if context:
        md += ["", "Baselines / floor:", "", render_markdown(RATIO_HEADERS, ratio_rows(context))]
    if scale:
        md += ["", "Scale curve:", "", render_markdown(SCALE_HEADERS, scale_rows(scale))]
    md += ["", "Targets:", "", render_markdown(TARGET_HEADERS, target_rows(targets))]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"results: {out} (+ {out.with_suffix('.md').name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
