"""A writer process for the PostgreSQL contenders: appends single message events through
``PostgresLog`` from several threads (another "host" of the same log).

    python -m bench.pg_writer --url URL --profile P [--threads 8] [--count N | --rate R --seconds S] [--acks]

Protocol on stdout (one line each, flushed): ``ready``; with ``--acks`` ``a <seq> <t_ack>`` per
append (``t_ack`` = ``time.monotonic()``, CLOCK_MONOTONIC, comparable across processes, taken
right after ``append`` returned); ``done <json>`` at the end (appends, t_start, t_end, rate,
append latency). ``--count``: N appends in total, back to back. ``--rate``: R appends/s in
total for S seconds, thread ``i`` of ``T`` sending append ``k`` at ``start + (i + k*T) / R``.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from bench.common import Recorder
from bench.workload import DEFAULT_SEED, Workload

POOL = 4000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_writer")
    ap.add_argument("--url", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--name", default="w")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--acks", action="store_true")
    args = ap.parse_args(argv)

    from bench.contenders_eventlog import msg_event
    from eventlog.log.postgres import PostgresLog

    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    msgs = list(Workload(POOL, seed=DEFAULT_SEED).messages())
    T = args.threads
    log = PostgresLog.open(args.url, profile=args.profile)
    sids = [f"{args.name}-s{i}" for i in range(T)]
    log.append([{"type": "session.created", "session": s, "data": {"source": "bench"}} for s in sids])
    recs = [Recorder() for _ in range(T)]
    per_thread = [args.count // T + (1 if i < args.count % T else 0) for i in range(T)]
    start = time.monotonic() + 0.05
    say("ready")

    def work(i: int) -> None:
        rec, k = recs[i], 0
        while True:
            if args.rate:
                due = start + (i + k * T) / args.rate
                if due - start > args.seconds:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            elif k >= per_thread[i]:
                return
            m = msgs[(i + k * T) % POOL]
            t0 = time.perf_counter()
            seq = log.append([msg_event(sids[i], m)])[0]
            t1 = time.perf_counter()
            rec.add(t1 - t0)
            if args.acks:
                say(f"a {seq} {time.monotonic()!r}")
            k += 1

    while time.monotonic() < start:
        time.sleep(0.001)
    t_start = time.monotonic()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(T)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t_end = time.monotonic()
    log.close()
    rec = Recorder()
    for r in recs:
        rec.extend(r)
    n = len(rec)
    say("done " + json.dumps({"appends": n, "t_start": t_start, "t_end": t_end,
                              "rate": round(n / (t_end - t_start), 1) if t_end > t_start else None,
                              "append_ms": rec.summary()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
