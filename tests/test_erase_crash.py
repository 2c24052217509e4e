"""SIGKILL during erase and during compaction: nothing acknowledged is lost, an erase is either
complete or not started, the chain verifies, and the next compaction leaves no orphan files."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from campaign import size
from campaign.summary import record

from eventlog.log import codec
from eventlog.log.lmdb import EventLog, generation_dir
from eventlog.sessions.store import SessionStore

pytest_plugins = ["campaign.summary"]
ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import sys
    from eventlog.sessions.store import SessionStore
    with SessionStore.open(sys.argv[1], "p", follower=False) as store:
        print("START", flush=True)
        if sys.argv[2] == "erase":
            store.erase_session(sys.argv[3], "crash test")
        else:
            store.compact()
        print("DONE", flush=True)
""")


def build(home: Path, rng: random.Random) -> tuple[str, list[str]]:
    with SessionStore.open(home, "p", follower=False, durability="nosync") as store:
        victim = store.create_session(source="cli")
        keep = [store.create_session(source="cli") for _ in range(3)]
        for i in range(400):
            store.append_messages(victim, [{"role": "user", "content": f"secret {i} " + "x" * rng.randint(50, 900)}])
            store.append_message(keep[i % 3], "user", f"kept {i}")
    return victim, keep


def check(home: Path, victim: str, before: dict[int, dict]) -> list[str]:
    problems = []
    with EventLog.open(home / "profiles" / "p" / "log") as lg:
        res = lg.verify()
        if not res.ok:
            return [f"verify failed: {res}"]
        after = {e["seq"]: e for e in lg.read()}
    if set(before) - set(after):
        problems.append(f"lost events {sorted(set(before) - set(after))[:5]}")
    victim_seqs = [s for s, e in before.items() if e.get("session") == victim]
    erased = [s for s in victim_seqs if codec.is_stub(after[s])]
    records = [e for e in after.values() if e["type"] == "log.erased"]
    if erased and (len(erased) != len(victim_seqs) or len(records) != 1):
        problems.append(f"half an erase: {len(erased)} of {len(victim_seqs)} stubs, {len(records)} records")
    if not erased and records:
        problems.append("an erase record without its stubs")
    for s, e in before.items():
        if e.get("session") != victim and after[s] != e:
            problems.append(f"event {s} of another session changed")
            break
    return problems


@pytest.mark.parametrize("what", ["erase", "compact"])
def test_kills_during_erase_and_compaction(tmp_path: Path, what: str) -> None:
    kills = size(3, 25)
    rng = random.Random(hash(what) & 0xFFFF)
    failures, completed = [], 0
    for k in range(kills):
        home = tmp_path / f"h{k}"
        victim, _keep = build(home, rng)
        with EventLog.open(home / "profiles" / "p" / "log") as lg:
            before = {e["seq"]: e for e in lg.read()}
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(home), what, victim], stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert child.stdout is not None and child.stdout.readline() == "START\n"
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        problems = check(home, victim, before)
        with SessionStore.open(home, "p", follower=False) as store:  # the next process finishes cleanly
            if what == "erase":
                store.erase_session(victim, "after the kill")
            store.compact()
        log_dir = home / "profiles" / "p" / "log"
        leftovers = sorted(n for n in os.listdir(log_dir) if n.endswith(".tmp")
                           or (n.startswith("g") and n != generation_dir(log_dir).name))
        if leftovers:
            problems.append(f"orphans after the next compaction: {leftovers}")
        problems += [p for p in check(home, victim, before) if not p.startswith("half") or what != "erase"]
        if problems:
            failures.append(f"kill {k}: " + "; ".join(problems))
        else:
            completed += 1
    record(f"SIGKILL during {what}", runs=kills, passed=completed, lost=0)
    assert not failures, "\n".join(failures)
