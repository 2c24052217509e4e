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


KILL_AT = textwrap.dedent("""
    import os, signal, sys
    from eventlog.log import lmdb
    from projections.projector import Projector
    from eventlog.sessions.store import SessionStore

    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)

    if sys.argv[2] == "compact":
        lmdb._Environment.compact = die      # the erase is committed; its compaction never runs
    elif sys.argv[2] == "purge":
        Projector.purge = die                # the log is compacted; the projections still hold the words
    elif sys.argv[2] == "retire":
        lmdb._Environment._retire = die      # current moved to the new generation; the old files stay
    with SessionStore.open(sys.argv[1], "p", follower=False) as store:
        store.erase_session(sys.argv[3], "crash test")
""")


@pytest.mark.parametrize("point", ["compact", "purge", "retire"])
def test_an_erase_killed_before_its_files_are_clean_is_finished_by_the_retry(tmp_path: Path, point: str) -> None:
    """The stubs are committed first; the compaction and the projection purge that take the
    words out of the files come after. A SIGKILL between them left the words on disk for good:
    a retried erase found nothing left to erase and did nothing, and doctor said ok (found by an
    outside audit). The log now records the erase as pending until its files are clean; doctor
    reports it, and the retry (or `eventlog compact`) finishes it."""
    import json

    from test_erase import MARKER, traces

    home = tmp_path / "home"
    with SessionStore.open(home, "p", follower=False) as store:
        victim = store.create_session(source="cli")
        keep = store.create_session(source="cli")
        for i in range(200):
            store.append_message(victim, "user", f"{MARKER} {i} " + "y" * 300)
            store.append_message(keep, "user", f"kept {i}")
        assert store.search(MARKER)["results"]
    assert traces(home)
    child = subprocess.run([sys.executable, "-c", KILL_AT, str(home), point, victim],
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert child.returncode == -signal.SIGKILL
    exe = str(Path(sys.executable).with_name("eventlog"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, "--home", str(home), "--profile", "p", *args], capture_output=True, text=True,
                              timeout=120)

    doctor = cli("doctor", "--json")
    report = json.loads(doctor.stdout)
    assert doctor.returncode == 1 and report["log"]["erase_pending"] and report["log"]["ok"], doctor.stdout
    assert traces(home), "the kill came before the files were clean: nothing to finish"
    again = cli("sessions", "erase", victim, "--reason", "retry")
    assert again.returncode == 0, again.stderr
    assert traces(home) == []
    log_dir = home / "profiles" / "p" / "log"
    assert not [n for n in os.listdir(log_dir) if n.endswith(".tmp") or (n.startswith("g") and n != generation_dir(log_dir).name)]
    doctor = cli("doctor", "--json")
    assert doctor.returncode == 0 and json.loads(doctor.stdout)["log"]["erase_pending"] is None, doctor.stdout
    with SessionStore.open(home, "p", follower=False) as store:
        assert len(store.get_messages(keep, limit=None)) == 200 and store.get_session(victim) is None
