"""Run ONE full ``SessionStore.rebuild()`` in this (fresh) process and print one JSON line,
so that peak RSS (VmHWM) is the rebuild's own and not that of the prefill before it.

    python -m bench.rebuild_one --dir DIR [--profile bench]

Prints ``{"ok", "open_s", "rebuild_s", "events", "events_per_s", "rss_before_mb",
"peak_rss_mb", "stats"}``.  ``peak_rss_mb`` covers the interpreter, the (cheap, already
caught-up) open and the rebuild.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback

from bench.common import _status_kb, peak_rss_mb, rss_mb


class _AnonPeak:
    """Samples RssAnon every 20 ms: VmHWM also counts the log's pages mapped by LMDB, which
    are file-backed page cache the kernel can drop, so the anonymous peak is reported beside it."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _status_kb("RssAnon") or 0)
            self._stop.wait(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak_kb / 1024, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rebuild_one")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--profile", default="bench")
    args = ap.parse_args(argv)
    out = sys.stdout
    sys.stdout = sys.stderr
    res: dict = {"ok": False}
    try:
        from bench.contenders_eventlog import _jsonable
        from eventlog import SessionStore

        anon = _AnonPeak()
        rss0 = rss_mb()
        t0 = time.perf_counter()
        with SessionStore.open(home=args.dir, profile=args.profile) as s:
            open_s = time.perf_counter() - t0
            rss1 = rss_mb()
            t1 = time.perf_counter()
            stats = s.rebuild()
            rebuild_s = time.perf_counter() - t1
        events = stats.get("events") if isinstance(stats, dict) else None
        res = {"ok": True, "open_s": round(open_s, 4), "rebuild_s": round(rebuild_s, 4), "events": events,
               "events_per_s": round(events / rebuild_s, 1) if events and rebuild_s else None,
               "rss_start_mb": rss0, "rss_before_mb": rss1, "peak_rss_mb": peak_rss_mb(),
               "peak_anon_mb": anon.stop(),
               "stats": _jsonable(stats)}
    except Exception as e:  # noqa: BLE001
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8),
               "peak_rss_mb": peak_rss_mb()}
    out.write(json.dumps(res) + "\n")
    out.flush()
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
