"""Concurrency: 4 processes x 4 threads appending through SessionStore while 2 processes list
and search in a loop.

One gapless order, every acknowledged write present exactly once, no error (lock errors
included) surfaced to any caller — every child reports errors on stderr and any stderr output
fails the test. Reader latency p50/p99 is printed (never asserted).
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

import orjson
import pytest
from campaign import PROFILE, Child, check_log, log_dir, parse_acks, size
from campaign.summary import note, record

pytest_plugins = ["campaign.summary"]

WRITERS, THREADS, READERS = 4, 4, 2
TAG = re.compile(r"^(w\d+-t\d+)-(\d+) ")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def run_load(tmp_path: Path, count: int, case: str) -> None:
    home = tmp_path / "home"
    model = "projection"
    from eventlog.sessions.store import SessionStore

    SessionStore.open(home, PROFILE, read_model=model).close()
    stop = tmp_path / "stop"
    readers = [Child("store_reader", home, PROFILE, model, stop) for _ in range(READERS)]
    for r in readers:
        assert r.wait_line("READY", timeout=60) is not None, r.stderr
    writers = [Child("store_writer", home, PROFILE, f"w{n}", THREADS, count, model) for n in range(WRITERS)]
    codes = [w.finish(timeout=600) for w in writers]
    stop.touch()
    rcodes = [r.finish(timeout=120) for r in readers]

    problems = [f"writer {n} exited {c}: {w.stderr[-1500:]}" for n, (w, c) in enumerate(zip(writers, codes)) if c]
    problems += [f"writer {n} wrote on stderr: {w.stderr[-1500:]}" for n, w in enumerate(writers) if w.stderr]
    problems += [f"reader {n} exited {c}: {r.stderr[-1500:]}" for n, (r, c) in enumerate(zip(readers, rcodes)) if c]
    problems += [f"reader {n} wrote on stderr: {r.stderr[-1500:]}" for n, r in enumerate(readers) if r.stderr]

    acked = [a for w in writers for a in parse_acks(w.lines)]
    found, lost, envs = check_log(log_dir(home), acked)
    problems += found
    tags: dict[str, list[int]] = {}
    seq_of: dict[str, int] = {}
    for e in envs:
        if e["type"] == "message.appended":
            m = TAG.match(e["data"].get("content") or "")
            if m:
                tags.setdefault(m.group(1), []).append(int(m.group(2)))
                seq_of[f"{m.group(1)}-{m.group(2)}"] = e["seq"]
    expected_sessions = {f"w{n}-t{t}" for n in range(WRITERS) for t in range(THREADS)}
    for sid in sorted(expected_sessions):
        if tags.get(sid) != list(range(count)):
            got = tags.get(sid, [])
            problems.append(f"{sid}: messages {len(got)} of {count}, duplicated {len(got) - len(set(got))}, "
                            f"in order {got == sorted(got)}")
    messages_acked = sum(1 for a in acked if a[0] == "message.appended")
    if messages_acked != WRITERS * THREADS * count:
        problems.append(f"{messages_acked} messages acknowledged, expected {WRITERS * THREADS * count}")
    with SessionStore.open(home, PROFILE, read_model=model) as store:
        store.sync()
        for sid in sorted(expected_sessions):
            contents = [m["content"] for m in store.get_messages(sid)]
            if [TAG.match(c).group(2) for c in contents if TAG.match(c)] != [str(i) for i in range(count)]:
                problems.append(f"{sid}: the read model does not show the messages in order")

    lat = {"list_ms": [], "search_ms": []}
    for r in readers:
        for line in r.lines:
            if line.startswith("{"):
                body = orjson.loads(line)
                lat["list_ms"] += body["list_ms"]
                lat["search_ms"] += body["search_ms"]
    figures = ", ".join(f"{k[:-3]} p50 {pct(v, 50):.2f} ms p99 {pct(v, 99):.2f} ms ({len(v)} calls)"
                        for k, v in lat.items())
    text = (f"{case}: {WRITERS}x{THREADS} writers, {len(envs)} events, read model {model}; "
            f"readers under load: {figures}")
    print("\n" + text)
    note(text)
    record(case, runs=1, passed=0 if problems else 1, lost=lost)
    assert not problems, "\n".join(problems[:20])
    assert all(lat.values()), "the readers should have completed calls during the load"


def test_writers_and_readers_in_parallel(tmp_path: Path) -> None:
    run_load(tmp_path, size(40, 40), "concurrency 4x4 writers + 2 readers")


@pytest.mark.campaign
def test_writers_and_readers_in_parallel_campaign(tmp_path: Path) -> None:
    run_load(tmp_path, size(400, 400), "concurrency campaign 4x4 writers + 2 readers")


GATEWAY = """
import sys, threading, time
from eventlog import SessionStore
home, seconds = sys.argv[1], float(sys.argv[2])
stop = time.time() + seconds
with SessionStore.open(home, "p") as st:
    def work(i):
        sid = st.create_session(source="gateway")
        n = 0
        while time.time() < stop:
            st.append_message(sid, "user", f"hello t{i} n{n} zebra{n} word{n % 97}")
            n += 1
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    for t in threads:
        t.join()
"""


def test_doctor_beside_a_busy_gateway_finds_nothing_wrong_and_rebuilds_nothing(tmp_path: Path) -> None:
    """doctor read the index's counts in separate snapshots and compared its cursor with a
    state.db cursor read earlier: beside a gateway writing it called a healthy index corrupt or
    ahead (exit 1), and doctor --fix rebuilt it again and again (found by an outside audit)."""
    import json
    import os
    import subprocess
    import sys

    exe = str(Path(sys.executable).with_name("eventlog"))
    root = str(Path(__file__).resolve().parent.parent)
    gateway = subprocess.Popen([sys.executable, "-c", GATEWAY, str(tmp_path), "30"], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=root))
    alarms: list[tuple[str, str]] = []
    fixed: list[str] = []
    try:
        assert gateway.stdout is not None and gateway.stdout.readline().strip() == "ready"
        for i in range(16):
            args = ["doctor", "--json"] if i % 2 == 0 else ["doctor", "--fix", "--json"]
            r = subprocess.run([exe, "--home", str(tmp_path), "--profile", "p", *args], capture_output=True, text=True,
                               timeout=120)
            report = json.loads(r.stdout)
            alarms += [(part, report[part]["status"]) for part in ("state", "fts")
                       if report[part]["status"] in ("corrupt", "ahead", "foreign", "unreadable")]
            fixed += [f for f in report.get("fixed", []) if f.startswith("rebuilt")]
    finally:
        gateway.kill()
        gateway.wait()
    assert not alarms and not fixed, (alarms, fixed)
