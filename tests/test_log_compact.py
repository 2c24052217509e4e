"""Compaction: the log rewritten into a new generation folder holding only live records, switched
to by every process, crash-safe, and a format-1 log migrated to format 2 through a verified copy."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import lmdb
import pytest

from eventlog.log import stored
from eventlog.log.lmdb import EventLog, generation_dir
from eventlog.sessions.store import SessionStore

DATA = Path(__file__).parent / "data"


def ev(session: str = "s1", **data: object) -> dict[str, object]:
    return {"type": "test.happened", "session": session, "data": data}


def fill(p: Path, n: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    with EventLog.open(p, durability="nosync") as lg:
        for b in range(0, n, 100):
            lg.append([ev(f"s{rng.randrange(9)}", i=b + i, text=" ".join(rng.choice(["alpha", "beta", "gamma", "kernel"])
                                                                         for _ in range(rng.randint(5, 200))))
                       for i in range(min(100, n - b))])


def test_compaction_keeps_the_chain_and_moves_every_handle(tmp_path: Path) -> None:
    p = tmp_path / "log"
    fill(p, 1500)
    with EventLog.open(p) as lg, EventLog.open(p) as other:
        before = list(lg.read(raw=True))
        head = lg.head()
        out = lg.compact()
        assert out["generation"] == "g1" and generation_dir(p) == p / "g1"
        assert out["bytes_after"] <= out["bytes_before"]
        assert list(other.read(raw=True)) == before and other.head() == head and other.verify().ok
        assert other.append([ev(n="after")]) == [head[0] + 1]
        assert lg.compact()["generation"] == "g2"
        assert sorted(n for n in os.listdir(p) if n.startswith("g")) == ["g2"]
        assert lg.verify().ok and lg.head()[0] == head[0] + 1
    # A program of the first release opening the old layout fails loudly instead of starting a new log.
    with pytest.raises(lmdb.Error):
        lmdb.open(str(p), max_dbs=8)


WRITER = textwrap.dedent("""
    import sys, time
    from eventlog.log.lmdb import EventLog
    with EventLog.open(sys.argv[1]) as lg:
        for i in range(int(sys.argv[2])):
            seq = lg.append([{"type": "test.happened", "session": "w", "data": {"i": i}}])[0]
            print("ACK", i, seq, flush=True)
""")


def test_writers_in_other_processes_carry_on_across_a_compaction(tmp_path: Path) -> None:
    p = tmp_path / "log"
    fill(p, 500)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(p), "400"], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    first = writer.stdout.readline()
    assert first.startswith("ACK")
    with EventLog.open(p) as lg:
        lg.compact()
        lg.compact()
    acks = [first] + writer.stdout.readlines()
    assert writer.wait(60) == 0
    seqs = {int(line.split()[2]) for line in acks}
    assert len(seqs) == 400
    with EventLog.open(p) as lg:
        assert lg.verify().ok and lg.head()[0] == 900
        written = {e["seq"] for e in lg.read_session("w")}
    assert seqs == written


def test_a_format_1_log_is_migrated_to_format_2_through_a_verified_copy(tmp_path: Path) -> None:
    log_dir = tmp_path / "profiles" / "legacy"
    log_dir.mkdir(parents=True)
    with tarfile.open(DATA / "format1-log.tgz") as tar:
        tar.extractall(log_dir)
    p = log_dir / "log"
    with SessionStore.open(tmp_path, "legacy", follower=False) as store:
        answers = (store.list_sessions(), store.get_messages("legacy-0"), store.search("naïve"))
    with EventLog.open(p) as lg:
        before = list(lg.read(raw=True))
        assert lg._core.format == stored.FORMAT_1
        lg.compact()
        assert lg._core.format == stored.FORMAT_2 and list(lg.read(raw=True)) == before and lg.verify().ok
    env = lmdb.open(str(p / "g1"), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:
        kinds = {bytes(v)[0] for _, v in txn.cursor(db=env.open_db(b"events", txn=txn))}
    env.close()
    assert kinds == {stored.KIND_EVENT}
    with SessionStore.open(tmp_path, "legacy", follower=False) as store:
        store.rebuild()
        assert (store.list_sessions(), store.get_messages("legacy-0"), store.search("naïve")) == answers


COMPACTOR = textwrap.dedent("""
    import sys
    from eventlog.log.lmdb import EventLog
    with EventLog.open(sys.argv[1]) as lg:
        print("START", flush=True)
        lg.compact()
        print("DONE", flush=True)
""")


@pytest.mark.parametrize("seed", range(6))
def test_a_compaction_killed_at_any_moment_loses_nothing(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    p = tmp_path / "log"
    fill(p, 3000, seed)
    with EventLog.open(p) as lg:
        if seed % 2:
            lg.compact()  # half the runs kill a compaction of an already compacted log
        expect = list(lg.read(raw=True))
    child = subprocess.Popen([sys.executable, "-c", COMPACTOR, str(p)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "START\n"
    time.sleep(rng.uniform(0.0, 0.6))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with EventLog.open(p) as lg:
        assert lg.verify().ok and list(lg.read(raw=True)) == expect
        lg.append([ev(n="after the kill")])
        lg.compact()  # finishes cleanly and removes what the killed one left
        assert sorted(n for n in os.listdir(p) if n.startswith("g") or n.endswith(".tmp")) == [generation_dir(p).name]
        assert lg.verify().ok and lg.head()[0] == len(expect) + 1


def compact_elsewhere(p: Path, times: int = 1) -> None:
    """Compact the log at ``p`` in another process (its folder of the moment is retired)."""
    script = "import sys\nfrom eventlog.log.lmdb import EventLog\nwith EventLog.open(sys.argv[1]) as lg:\n" \
             f"    for _ in range({times}): lg.compact()\n"
    subprocess.run([sys.executable, "-c", script, str(p)], check=True, timeout=60)


def generations(p: Path) -> list[str]:
    return sorted(n for n in os.listdir(p) if n.startswith("g") or n.endswith(".tmp"))


def test_a_first_write_after_another_process_compacted_goes_to_the_new_generation(tmp_path: Path) -> None:
    # A handle that has only read opens the environment read-only; its first write reopens it
    # for writing, in the generation that is current by then (the one it read from is gone).
    p = tmp_path / "log"
    fill(p, 300)
    with EventLog.open(p) as first:
        first.compact()
    with EventLog.open(p) as lg:
        assert lg.head()[0] == 300
        compact_elsewhere(p)
        assert lg.append([ev(n="after")]) == [301]
        assert [e["data"] for e in lg.read(301)] == [{"n": "after"}]
        assert lg.verify().ok
    assert generations(p) == [generation_dir(p).name] == ["g2"]


@pytest.mark.parametrize("where", ["open", "reopen"])
def test_an_open_meeting_a_compaction_follows_current_to_the_newer_generation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    # Another process's compaction retires the folder ``current`` named between this process
    # reading the link and opening the environment there (readers do not hold compactions
    # back). The open follows the link again; it never fails, and never starts an empty log in
    # the retired folder. A real compaction in a real process, run at that exact moment.
    import eventlog.log.lmdb as lmdb_log

    p = tmp_path / "log"
    fill(p, 300)
    with EventLog.open(p) as first:
        first.compact()
    real = lmdb_log.generation_dir
    armed = {"left": 1}

    def generation_then_compaction(log_dir: Path) -> Path:
        found = real(log_dir)
        # only where the folder found is then opened (not in the checks whether it moved)
        opening = sys._getframe(1).f_code.co_name in ("__init__", "_open_first", "_ensure_lock", "_open_current")
        if armed["left"] and opening and found.name.startswith("g"):
            armed["left"] -= 1
            compact_elsewhere(p)  # retires ``found``
        return found

    if where == "open":
        monkeypatch.setattr(lmdb_log, "generation_dir", generation_then_compaction)
        lg = EventLog.open(p)
    else:
        lg = EventLog.open(p)
        assert lg.head()[0] == 300
        compact_elsewhere(p)  # this handle reopens at its next read, and meets another compaction
        monkeypatch.setattr(lmdb_log, "generation_dir", generation_then_compaction)
    try:
        assert armed["left"] == 0 or where == "reopen"
        assert lg.head()[0] == 300 and len(list(lg.read())) == 300
        assert armed["left"] == 0
        assert lg.append([ev(n="after")]) == [301]
        assert lg.verify().ok
    finally:
        lg.close()
    monkeypatch.setattr(lmdb_log, "generation_dir", real)
    assert generations(p) == [generation_dir(p).name]
