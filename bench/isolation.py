"""What running the log-walking commands in a forked child costs (docs/RELIABILITY.md).

    python -m bench.isolation [--messages 100000] [--runs 10] [--out bench/results/isolation.json]

Builds a profile of ``--messages`` messages in one session, then times fresh ``eventlog``
processes of ``rebuild``, ``export`` (jsonl) and ``stats`` with the child (the default) and
without it (``EVENTLOG_NO_ISOLATION=1``), the two interleaved run by run so that a busy machine
weighs on both alike. Prints the medians and minimums and their differences.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EVENTLOG = [sys.executable, "-c", "from eventlog.cli import main; main()"]


def build(home: Path, messages: int) -> None:
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(home, "p", follower=False) as store:
        sid = store.create_session(source="cli")
        for start in range(0, messages, 250):
            store.append_messages(sid, [{"role": "user", "content": f"message {i} " + "x" * (i % 300)}
                                        for i in range(start, min(start + 250, messages))])
        store.list_sessions()


def timed(home: Path, args: list[str], isolated: bool) -> float:
    env = dict(os.environ)
    env.pop("EVENTLOG_NO_ISOLATION", None)
    if not isolated:
        env["EVENTLOG_NO_ISOLATION"] = "1"
    t = time.perf_counter()
    subprocess.run([*EVENTLOG, "--home", str(home), "--profile", "p", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    results: dict[str, Any] = {"messages": opts.messages, "runs": opts.runs, "commands": {}}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        build(home, opts.messages)
        commands = {"rebuild": ["rebuild"], "export jsonl": ["export", str(Path(tmp) / "out.jsonl")],
                    "stats": ["stats"]}
        for name, args in commands.items():
            runs: dict[bool, list[float]] = {True: [], False: []}
            for i in range(opts.runs):
                for isolated in ((True, False) if i % 2 else (False, True)):
                    runs[isolated].append(timed(home, args, isolated))
            row = {("child" if k else "in_process"): {"median_s": statistics.median(v), "min_s": min(v)}
                   for k, v in runs.items()}
            row["median_difference_ms"] = 1000 * (row["child"]["median_s"] - row["in_process"]["median_s"])
            results["commands"][name] = row
            print(f"{name:<13} in-process median {row['in_process']['median_s']:.3f} s "
                  f"(min {row['in_process']['min_s']:.3f}); in a child median {row['child']['median_s']:.3f} s "
                  f"(min {row['child']['min_s']:.3f}); difference {row['median_difference_ms']:+.1f} ms", flush=True)
    if opts.out:
        Path(opts.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
