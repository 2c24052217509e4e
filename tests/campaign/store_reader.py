"""Child of the concurrency test: lists and searches in a loop while others append.

usage: python -m campaign.store_reader HOME PROFILE READ_MODEL STOP_FILE

Loops until STOP_FILE exists: ``list_sessions()`` then ``search(word)``, timing each call.
Prints one JSON line ``{"list_ms": [...], "search_ms": [...], "errors": n}`` at the end; every
error goes to stderr (the parent fails on any stderr output).
"""
from __future__ import annotations

import os
import sys
import time
import traceback

import orjson

WORDS = ["gateway", "latency", "probe", "load"]


def main() -> int:
    home, profile, model, stop = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    from eventlog.sessions.store import SessionStore

    lists: list[float] = []
    searches: list[float] = []
    errors = 0
    with SessionStore.open(home, profile, read_model=model) as store:
        print("READY", flush=True)
        n = 0
        while not os.path.exists(stop):
            try:
                t0 = time.perf_counter()
                store.list_sessions()
                t1 = time.perf_counter()
                store.search(WORDS[n % len(WORDS)], limit=20)
                t2 = time.perf_counter()
                lists.append((t1 - t0) * 1000)
                searches.append((t2 - t1) * 1000)
            except Exception:
                errors += 1
                sys.stderr.write(traceback.format_exc())
                sys.stderr.flush()
            n += 1
    print(orjson.dumps({"list_ms": lists, "search_ms": searches, "errors": errors}).decode(), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
