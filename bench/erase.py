"""Erase and compaction: what an erasure request costs (issue 18).

    python -m bench.erase [--session-messages 10000] [--other-messages 40000] [--out bench/results/erase.json]

Builds a profile holding one session of ``--session-messages`` workload messages among other
sessions holding ``--other-messages`` more (bench.workload, synced appends in batches), then
in one run:

- ``SessionStore.erase_session`` of the big session, end to end (stubs + ``log.erased`` record,
  compaction of the log, rebuild of state.db and the search index), with its parts timed apart
  (``EventLog.erase(compact=False)``, ``EventLog.compact``, ``Projector.purge``) on a copy;
- ``eventlog compact`` throughput (MB/s of the log file before compaction; it includes a full
  chain verification of the copy, whose share is printed: ``log verify`` on the result) beside
  a plain copy of a file of the same size (read, write, fsync) in the same directory — the
  ceiling a rewrite of the file cannot beat;
- bytes reclaimed: the log file before and after, state.db and fts.db before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import environment, fs_type
from bench.workload import Workload

PROFILE = "bench"
FIELDS = ("role", "content", "tool_calls", "tool_name", "tool_call_id", "reasoning", "token_count")


def _fill(home: Path, session_messages: int, other_messages: int) -> str:
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(home, PROFILE, follower=False) as store:
        big = store.create_session(source="bench", title="the session to erase")
        w = Workload(session_messages + other_messages)
        others: dict[str, str] = {}
        done = 0
        for wid, batch in w.batches(max_batch=200):
            msgs = [{k: m[k] for k in FIELDS if m.get(k) is not None} for m in batch]
            if done < session_messages:
                msgs = msgs[: session_messages - done]
                store.append_messages(big, msgs)
            else:
                sid = others.get(wid) or others.setdefault(wid, store.create_session(source="bench"))
                store.append_messages(sid, msgs)
            done += len(msgs)
        store.sync(timeout=600)
        store.search("the")  # the index is built
    return big


def _sizes(profile: Path) -> dict[str, int]:
    log_dir = profile / "log"
    data = (log_dir / "current" / "data.mdb") if (log_dir / "current").exists() else (log_dir / "data.mdb")
    out = {"log": data.stat().st_size}
    for name in ("state.db", "fts.db"):
        p = profile / name
        out[name] = sum(q.stat().st_size for q in profile.glob(os.path.basename(os.path.realpath(p)) + "*")) \
            if p.exists() else 0
    return out


def _plain_copy(src_size: int, where: Path) -> float:
    """Seconds to copy a file of ``src_size`` bytes (written and synced first) and fsync the copy."""
    src, dst = where / "copy.src", where / "copy.dst"
    chunk = os.urandom(1 << 20)
    with open(src, "wb") as f:
        left = src_size
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    started = time.perf_counter()
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - started
    src.unlink()
    dst.unlink()
    return seconds


def run(session_messages: int, other_messages: int, root: Path) -> dict[str, Any]:
    from eventlog.log.lmdb import EventLog
    from eventlog.sessions.store import SessionStore

    home = root / "home"
    profile = home / "profiles" / PROFILE
    t0 = time.perf_counter()
    big = _fill(home, session_messages, other_messages)
    fill_s = time.perf_counter() - t0
    parts_home = root / "parts"
    shutil.copytree(home, parts_home, symlinks=True)

    before = _sizes(profile)
    with SessionStore.open(home, PROFILE, follower=False) as store:
        events = store.version(big)
        started = time.perf_counter()
        result = store.erase_session(big, "bench: an erasure request")
        erase_s = time.perf_counter() - started
    after = _sizes(profile)

    # The same erase in parts, on the copy made before it.
    pprofile = parts_home / "profiles" / PROFILE
    with SessionStore.open(parts_home, PROFILE, follower=False) as store:
        seqs = [e["seq"] for e in store.log.read_session(big)]
    log = EventLog.open(pprofile / "log")
    try:
        started = time.perf_counter()
        log.erase(seqs, {"reason": "bench", "by": "bench", "sessions": [big]}, compact=False)
        stubs_s = time.perf_counter() - started
        log_before = _sizes(pprofile)["log"]
        started = time.perf_counter()
        compacted = log.compact()
        compact_s = time.perf_counter() - started
        copy_s = _plain_copy(log_before, pprofile)
        started = time.perf_counter()
        log.verify()  # compaction verifies its copy: this is that share of its time
        verify_s = time.perf_counter() - started
    finally:
        log.close()
    with _projector(pprofile) as proj:
        started = time.perf_counter()
        proj.purge()
        purge_s = time.perf_counter() - started

    mb = log_before / 1e6
    return {
        "session_messages": session_messages, "other_messages": other_messages,
        "session_events": events, "erased_events": result["events"], "fill_s": round(fill_s, 1),
        "erase_session_s": round(erase_s, 3),
        "parts_s": {"stubs_and_record": round(stubs_s, 3), "compact": round(compact_s, 3),
                    "of_which_verify_about": round(verify_s, 3),
                    "purge_projections": round(purge_s, 3)},
        "compact_mb_s": round(mb / compact_s, 1), "plain_copy_mb_s": round(mb / copy_s, 1),
        "compact_vs_copy": round(copy_s / compact_s, 2),
        "bytes_before": before, "bytes_after": after,
        "log_bytes_reclaimed": before["log"] - after["log"],
        "compact_result": compacted,
    }


class _projector:
    """A Projector on ``profile`` over its LMDB log, closed on exit."""

    def __init__(self, profile: Path) -> None:
        from eventlog.log.lmdb import EventLog
        from projections.projector import Projector

        self.log = EventLog.open(profile / "log")
        self.proj = Projector(profile, self.log)

    def __enter__(self) -> Any:
        return self.proj

    def __exit__(self, *exc: object) -> None:
        self.proj.close()
        self.log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.erase", description=__doc__.split("\n")[0])
    ap.add_argument("--session-messages", type=int, default=10_000)
    ap.add_argument("--other-messages", type=int, default=40_000)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        res = run(a.session_messages, a.other_messages, Path(tmp))
        res["machine"] = environment()
        res["fs"] = fs_type(tmp)
    print(f"erase_session of {res['session_events']} events ({res['session_messages']} messages) "
          f"among {res['other_messages']} others: {res['erase_session_s']:.2f} s")
    print("  parts: " + ", ".join(f"{k} {v:.2f} s" for k, v in res["parts_s"].items()))
    print(f"compact: {res['compact_mb_s']} MB/s; plain copy of the same size: {res['plain_copy_mb_s']} MB/s "
          f"(compact / copy speed = {res['compact_vs_copy']})")
    b, f = res["bytes_before"], res["bytes_after"]
    print("bytes before -> after: " + ", ".join(f"{k} {b[k]:,} -> {f[k]:,}" for k in b))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
