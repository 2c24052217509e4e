"""A writer process for the read-side contenders (``eventlog.readers_under_load``,
``eventlog.projection_lag``): appends messages through ``SessionStore`` (synced, the
default durability) while the contender's own process reads.

    python -m bench.load_writer --dir DIR [--threads 4] [--rate R] [--seconds S] [--acks]

Protocol on stdout (one line each, flushed):

* ``ready <head seq>`` once the store is open and its sessions exist (appends start then);
* with ``--acks``: ``a <seq> <t_ack>`` after every append, ``t_ack`` being
  ``time.monotonic()`` (CLOCK_MONOTONIC, comparable across processes) right after
  ``append_message`` returned;
* ``done <json>`` at the end: appends, seconds, achieved rate, append latency, head.

It stops when ``--seconds`` have passed (paced runs) or when its stdin reaches EOF (the
parent closes it), whichever comes first; ``--max-seconds`` is a safety net.

``--rate R`` paces the appends at R per second in total with a monotonic clock: thread
``i`` of ``T`` sends append ``k`` at ``start + (i + k*T) / R`` (it never skips; when
behind it sends at once).  Without ``--rate`` every thread appends back to back.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from bench.common import Recorder
from bench.workload import DEFAULT_SEED, Workload

POOL = 4000          # distinct workload messages cycled through
SESSIONS_PER_THREAD = 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.load_writer")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--profile", default="bench")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rate", type=float, default=0.0, help="appends/s in total (0 = full speed)")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0 = at stdin EOF)")
    ap.add_argument("--max-seconds", type=float, default=900.0)
    ap.add_argument("--acks", action="store_true", help="print 'a <seq> <t_ack>' per append")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)

    out = sys.stdout
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            out.write(line + "\n")
            out.flush()

    from bench.contenders_eventlog import msg_kwargs
    from eventlog import SessionStore

    pool = [msg_kwargs(m) for m in Workload(POOL, seed=args.seed + 1).messages()]
    n = max(1, args.threads)
    stop = threading.Event()

    def watch_stdin() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        stop.set()

    with SessionStore.open(home=args.dir, profile=args.profile) as s:
        sids = [[s.create_session(source="bench-writer") for _ in range(SESSIONS_PER_THREAD)] for _ in range(n)]
        s.sync()
        # the first append to a session waits for it to be projected (read-your-writes); do it untimed
        for per in sids:
            for sid in per:
                s.append_message(sid, role="user", content="warm-up")
        s.sync()
        recs = [Recorder() for _ in range(n)]
        counts = [0] * n
        behind = [0.0] * n
        errors: list[BaseException] = []
        threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()
        say(f"ready {s.log.head()[0]}")
        start = time.monotonic()
        end = start + (args.seconds or args.max_seconds)

        def work(i: int) -> None:
            rec, mine, k = recs[i], sids[i], 0
            try:
                while not stop.is_set():
                    j = i + k * n
                    if args.rate:
                        due = start + j / args.rate
                        if due >= end:
                            break
                        now = time.monotonic()
                        if due > now:
                            time.sleep(due - now)
                        else:
                            behind[i] = max(behind[i], now - due)
                    elif time.monotonic() >= end:
                        break
                    kw = pool[j % len(pool)]
                    t0 = time.monotonic()
                    seq = s.append_message(mine[k % len(mine)], **kw)
                    t1 = time.monotonic()
                    rec.add(t1 - t0)
                    if args.acks:
                        say(f"a {seq} {t1:.9f}")
                    counts[i] += 1
                    k += 1
            except BaseException as e:  # noqa: BLE001 - reported in the done line
                errors.append(e)
                stop.set()

        ts = [threading.Thread(target=work, args=(i,), name=f"writer-{i}") for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        seconds = time.monotonic() - start
        rec = Recorder()
        for r in recs:
            rec.extend(r)
        total = sum(counts)
        res: dict[str, Any] = {
            "appends": total,
            "seconds": round(seconds, 3),
            "rate": round(total / seconds, 1) if seconds > 0 else None,
            "target_rate": args.rate or None,
            "threads": n,
            "max_behind_schedule_ms": round(max(behind) * 1e3, 3) if args.rate else None,
            "append_ms": rec.summary(),
            "head": s.log.head()[0],
            "error": f"{type(errors[0]).__name__}: {errors[0]}" if errors else None,
        }
    say("done " + json.dumps(res))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
