"""Run ONE contender in this (fresh) process and print one JSON line on stdout.

    python -m bench.run_one NAME --messages N --dir DIR [--seed S] [--budget SEC]
                                 [--threads 8] [--chunk 5000] [--probe K] [--samples K]
                                 [--writer-threads 4] [--lag-rate 1000] [--lag-seconds 10]

Anything the contender prints goes to stderr; stdout carries only the result, so
``bench.__main__`` can read it.  Peak RSS (VmHWM) is this process's own.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from bench.common import failed_result, peak_rss_mb, rss_mb
from bench.registry import BY_NAME
from bench.workload import DEFAULT_SEED, Workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run_one")
    ap.add_argument("name", choices=sorted(BY_NAME))
    ap.add_argument("--messages", type=int, required=True)
    ap.add_argument("--dir", required=True, help="an empty directory for the contender's files")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--budget", type=float, default=0.0, help="seconds; stop after the chunk that crosses it (0 = none)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=5000)
    ap.add_argument("--probe", type=int, default=2000, help="scale contenders: timed appends after the prefill")
    ap.add_argument("--searches", type=int, default=100)
    ap.add_argument("--samples", type=int, default=500, help="readers_under_load: samples per phase")
    ap.add_argument("--writer-threads", type=int, default=4, help="readers_under_load: full-speed writer threads")
    ap.add_argument("--lag-rate", type=float, default=1000.0, help="projection_lag: appends/s")
    ap.add_argument("--lag-seconds", type=float, default=10.0, help="projection_lag: how long the writer runs")
    args = ap.parse_args(argv)

    out = sys.stdout
    sys.stdout = sys.stderr  # keep stdout for the one JSON line
    c = BY_NAME[args.name]
    os.makedirs(args.dir, exist_ok=True)
    n = args.messages + (args.probe if c.kind == "scale" else 0)
    opts = {"budget": args.budget or None, "threads": args.threads, "chunk": args.chunk,
            "probe": args.probe, "searches": args.searches, "samples": args.samples,
            "writer_threads": args.writer_threads, "lag_rate": args.lag_rate, "lag_seconds": args.lag_seconds}
    started = time.time()
    try:
        fn = c.load()
        rss0 = rss_mb()
        res = fn(Workload(n, seed=args.seed), args.dir, **opts)
        res["label"] = c.label
        res["rss_before_mb"] = rss0
    except Exception as e:  # noqa: BLE001 - one failing contender must not stop the run
        unavailable = type(e).__name__ == "ContenderUnavailable"
        res = failed_result(args.name, f"{'unavailable' if unavailable else type(e).__name__}: {e}")
        res["unavailable"] = unavailable
        if not unavailable:
            res["traceback"] = traceback.format_exc(limit=8)
            print(res["traceback"], file=sys.stderr)
    res["name"] = args.name
    res["kind"] = c.kind
    res["peak_rss_mb"] = peak_rss_mb()
    res["wall_s"] = round(time.time() - started, 2)
    out.write(json.dumps(res) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
