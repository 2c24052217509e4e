"""Real processes: SIGKILL during appends, and several processes appending at once."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventlog.errors import ConcurrencyError
from eventlog.log import EventLog

WRITER = Path(__file__).with_name("proc_log_writer.py")
KILLS = int(os.environ.get("EVENTLOG_KILLS", "20"))


def spawn(log: Path, name: str, threads: int, count: int, batch: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(log), name, str(threads), str(count), str(batch)],
        stdout=subprocess.PIPE, text=True,
    )


def acks(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ACK":  # a line cut by the kill is not an ack
            out[parts[1]] = int(parts[2])
    return out


def check_log(path: Path, acked: dict[str, int]) -> int:
    with EventLog.open(path) as lg:
        res = lg.verify()
        assert res.ok, res
        by_id = {e["id"]: e["seq"] for e in lg.read()}
        seqs = sorted(by_id.values())
        assert seqs == list(range(1, len(seqs) + 1)), "seqs must be gapless"
        lost = {i: s for i, s in acked.items() if by_id.get(i) != s}
        assert not lost, f"acknowledged appends lost or moved: {list(lost.items())[:5]}"
        return res.head_seq


def test_sigkill_during_appends_loses_no_acknowledged_write(tmp_path: Path) -> None:
    path = tmp_path / "log"
    rng = random.Random(1234)
    acked: dict[str, int] = {}
    for round_ in range(KILLS):
        p = spawn(path, f"r{round_}", threads=3, count=100_000, batch=rng.choice([1, 1, 5]))
        time.sleep(rng.uniform(0.05, 0.4))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        assert p.returncode == -signal.SIGKILL
        got = acks(out)
        acked.update(got)
        head = check_log(path, acked)
        assert head >= len(acked)
    with EventLog.open(path) as lg:
        before = lg.head()[0]
        assert lg.append([{"type": "test.after", "session": None, "data": {}}]) == [before + 1]
        assert lg.verify().ok
    assert len(acked) > KILLS  # the kills did land mid-work


def test_four_processes_of_four_threads_share_one_gapless_order(tmp_path: Path) -> None:
    path = tmp_path / "log"
    EventLog.open(path).close()
    procs = [spawn(path, f"p{n}", threads=4, count=60) for n in range(4)]
    acked: dict[str, int] = {}
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        acked.update(acks(out))
    assert len(acked) == 4 * 4 * 60
    head = check_log(path, acked)
    assert head == len(acked)
    assert len(set(acked.values())) == len(acked), "no seq given twice"
    with EventLog.open(path) as lg:
        for n in range(4):
            for t in range(4):
                assert [e["data"]["i"] for e in lg.read_session(f"p{n}-{t}")] == list(range(60))


def test_expected_versions_count_the_appends_of_other_processes(tmp_path: Path) -> None:
    """A log keeps the stream versions it has seen between appends; an append of another process
    (which moves the head) must make it count again, never check against a stale version."""
    path = tmp_path / "log"
    code = ("import sys; from eventlog.log import EventLog\n"
            "with EventLog.open(sys.argv[1]) as lg:\n"
            "    lg.append([{'type': 'test.other', 'session': 's', 'data': {}}], expected_version=int(sys.argv[2]))\n")

    def other(expected: int) -> None:
        subprocess.run([sys.executable, "-c", code, str(path), str(expected)], check=True)

    with EventLog.open(path) as lg:
        one = [{"type": "test.mine", "session": "s", "data": {}}]
        assert lg.append(one, expected_version=0) == [1]
        assert lg.append(one + one, expected_version=1) == [2, 3]  # the kept version, counted on
        other(3)
        with pytest.raises(ConcurrencyError) as info:
            lg.append(one, expected_version=3)  # stale: the other process made it 4
        assert info.value.actual == 4
        other(4)
        lg.append([{"type": "test.mine", "session": "t", "data": {}}])  # another stream: the head moves again
        assert lg.append(one, expected_version=5) == [7]
        assert lg.stream_version("s") == 6


def test_verify_while_another_process_appends_is_not_damage(tmp_path: Path) -> None:
    """Events appended by another process while a verify reads are verified too, never reported
    missing: a live log is not a broken one (an outside audit saw 8 of 8 `log verify` runs
    say BROKEN beside a running agent)."""
    path = tmp_path / "log"
    with EventLog.open(path) as lg:
        lg.append([{"type": "test.happened", "session": "s", "data": {"i": 0}}])
    writer = spawn(path, "w", threads=2, count=4000)
    try:
        results = []
        with EventLog.open(path) as lg:
            deadline = time.monotonic() + 60
            while len(results) < 20 and writer.poll() is None and time.monotonic() < deadline:
                if lg.head()[0] > 50:
                    results.append(lg.verify())
        assert len(results) >= 5, "the writer finished before verify could race it"
        bad = [r for r in results if not r.ok]
        assert not bad, bad[0]
        assert all(r.events >= 50 and r.events == r.head_seq for r in results)
    finally:
        writer.kill()
        writer.wait()
    with EventLog.open(path) as lg:
        assert lg.verify().ok


def test_the_head_after_a_writer_killed_inside_its_commit_is_the_durable_one(tmp_path: Path) -> None:
    """A writer SIGKILLed inside LMDB's commit, after its meta page, leaves its last commit
    durable but invisible to read transactions until the next writer recovers LMDB's lock (a
    third of the kills here). ``head()`` answered one event short, and a decision taken on it (a
    conditional append, a rule checked on a read model caught up to it) was wrong: an append at
    the head it returned was refused although no one else was writing."""
    p = tmp_path / "log"
    EventLog.open(p).close()
    rng = random.Random(7)
    with EventLog.open(p) as lg:
        lg.append([{"type": "test.happened", "session": "mine", "data": {}}])  # this handle writes too
        for _ in range(30):
            writer = spawn(p, "victim", 1, 1_000_000)
            assert writer.stdout is not None and writer.stdout.readline().startswith("ACK")
            time.sleep(rng.uniform(0.01, 0.15))
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait()
            at = lg.head()[0]
            assert lg.append([{"type": "test.happened", "session": "mine", "data": {"at": at}}],
                             expected_head=at) == [at + 1]
        assert lg.verify().ok
