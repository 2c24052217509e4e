"""Projections under real processes: a projector SIGKILLed mid-batch, processes racing to
rebuild, one writer at a time, and other processes' appends becoming visible."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import LeaseError
from eventlog.log import EventLog
from eventlog.sessions.events import make_event
from eventlog.sessions.fold import Fold
from projections import Projector, files
from projections import visibility as visibility_module
from projections.testing import answers, diff

SIDS = [f"s{i}" for i in range(6)] + ["zz"]
ROOT = Path(__file__).resolve().parent.parent

CATCH_UP = """
import sys, time
from eventlog.log import EventLog
from projections import Projector
log = EventLog.open(sys.argv[1], durability="nosync", profile="p")
read, read_checked = log.read, log.read_checked
def slow_read(from_seq=1, *a, **k):  # a catch-up keeps each batch's transaction open a while
    for env in read(from_seq, *a, **k):
        if from_seq > 1:
            time.sleep(0.0002)
        yield env
def slow_read_checked(from_seq, *a, **k):  # the path builds and catch-ups read the log by
    for item in read_checked(from_seq, *a, **k):
        if from_seq > 1:
            time.sleep(0.0002)
        yield item
log.read, log.read_checked = slow_read, slow_read_checked
p = Projector(sys.argv[2], log, "p", batch_size=int(sys.argv[3]))
print("ready", flush=True)
p.advance()
print("done", flush=True)
"""

ENSURE = """
import json, sys
from eventlog.log import EventLog
from projections import Projector, files
log = EventLog.open(sys.argv[1], durability="nosync", profile="p")
p = Projector(sys.argv[2], log, "p")
sys.stdin.readline()
if sys.argv[3] == "rebuild":
    p.rebuild("all")
else:
    p.heal()
r = p.reader()
print(json.dumps({"gen": files.read_pointer(p.state_pointer()).gen, "stats": r.stats()}), flush=True)
"""

APPEND = """
import sys, time
from eventlog.log import EventLog
from eventlog.sessions.events import make_event
log = EventLog.open(sys.argv[1], durability="nosync", profile="p")
for i in range(int(sys.argv[3])):
    sys.stdin.readline()
    log.append([make_event("message.appended", "s0", {"role": "user", "content": f"{sys.argv[2]} {i}"})])
    print(time.monotonic(), flush=True)
"""


def spawn(code: str, *args: Any, stdin: bool = False) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE if stdin else None, text=True, env=env, cwd=ROOT)


def add_events(log: EventLog, rng: random.Random, n: int) -> None:
    batch = []
    for _ in range(n):
        sid = rng.choice(SIDS[:6])
        r = rng.random()
        if r < 0.05:
            batch.append(make_event("session.created", sid, {"source": rng.choice(["cli", "tg"])}))
        elif r < 0.08:
            batch.append(make_event("session.titled", sid, {"title": f"T{rng.randrange(5)}"}))
        elif r < 0.10:
            batch.append(make_event("session.pinned", sid, {}))
        elif r < 0.20:
            batch.append(make_event("usage.recorded", sid, {"model": "m", "input_tokens": rng.randrange(100),
                                                             "estimated_cost_usd": rng.random()}))
        elif r < 0.22:
            batch.append(make_event("messages.rewound", sid, {"message_id": rng.randrange(1, log.head()[0] + 2)}))
        elif r < 0.25:
            batch.append(make_event("message.reaction_set", sid, {"message_id": rng.randrange(1, log.head()[0] + 2),
                                                                   "author": "ann", "emoji": "+1"}))
        elif r < 0.255:
            batch.append(make_event("session.deleted", sid, {}))
        else:
            batch.append(make_event("message.appended", sid, {"role": rng.choice(["user", "assistant"]),
                                                              "content": f"alpha {rng.randrange(1000)} beta"}))
        if len(batch) >= 100:
            log.append(batch)
            batch = []
    if batch:
        log.append(batch)


def fold_answers(log: EventLog, mids: list[int]) -> dict[Any, Any]:
    fold = Fold()
    fold.apply_all(log.read())
    return answers(fold, SIDS, mids)


def test_projector_killed_mid_batch_resumes_exactly(tmp_path: Path) -> None:
    rng = random.Random(4)
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    log.append([make_event("session.created", s, {}) for s in SIDS[:6]])
    add_events(log, rng, 3000)
    directory = tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
    kills = 0
    for round_ in range(22):
        if round_ in (7, 13):  # a broken state.db: this child dies rebuilding it, the next finishes
            os.unlink(files.read_pointer(directory / "state.db").path)  # type: ignore[union-attr]
        child = spawn(CATCH_UP, tmp_path / "log", directory, rng.choice([1, 2, 3, 7, 20]))
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        if round_ in (8, 14):
            assert child.wait(timeout=60) == 0
        else:
            time.sleep(0.02 if round_ in (7, 13) else rng.uniform(0.0, 0.05))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                kills += 1
            child.wait()
        child.stdout.close()
        add_events(log, rng, 400)
    assert kills >= 15  # nearly every round dies mid-batch (or mid-rebuild)
    with Projector(directory, log, "p") as p:
        p.advance()
        h = p.health(full=True)
        assert h["ok"], h
        mids = list(range(1, log.head()[0] + 2, 7))
        r = p.reader()
        got = answers(r, SIDS, mids)
        r.close()
    expected = fold_answers(log, mids)
    assert got == expected, "\n".join(diff(expected, got)[:5])
    assert log.verify().ok
    log.close()


@pytest.mark.parametrize("mode", ["heal", "rebuild"])
def test_processes_racing_to_rebuild(tmp_path: Path, mode: str) -> None:
    rng = random.Random(5)
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    log.append([make_event("session.created", s, {}) for s in SIDS[:6]])
    add_events(log, rng, 2000)
    directory = tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
    before = files.read_pointer(directory / "state.db")
    assert before is not None
    os.unlink(before.path)  # broken: every process that opens it wants to rebuild
    children = [spawn(ENSURE, tmp_path / "log", directory, mode, stdin=True) for _ in range(3)]
    for c in children:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    outs = []
    for c in children:
        out, _ = c.communicate(timeout=60)
        assert c.returncode == 0
        outs.append(json.loads(out))
    fold = Fold()
    fold.apply_all(log.read())
    assert all(o["stats"] == json.loads(json.dumps(fold.stats())) for o in outs)
    gens = {o["gen"] for o in outs}
    if mode == "heal":
        assert gens == {before.gen + 1}  # one rebuilt it; the others found it healthy under the lease
    with Projector(directory, log, "p") as p:
        assert p.health(full=True)["ok"]
        mids = list(range(1, log.head()[0] + 2, 5))
        r = p.reader()
        got = answers(r, SIDS, mids)
        r.close()
    assert got == fold_answers(log, mids)
    names = os.listdir(directory)
    assert len([n for n in names if n.startswith("state.") and files.parse(directory / n)]) <= 2, names
    log.close()


def test_one_writer_at_a_time_and_readers_never_wait(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    log.append([make_event("session.created", "s0", {})])
    directory = tmp_path / "p"
    holder = Projector(directory, log, "p")
    holder.advance()
    other = Projector(directory, log, "p")
    assert holder.lease.acquire(0)
    try:
        log.append([make_event("message.appended", "s0", {"role": "user", "content": "x"})])
        with pytest.raises(LeaseError):
            other.rebuild(timeout=0.05)
        reach = other.advance(wait=0.05)  # cannot write: watches the holder, which applies nothing
        assert not reach.done and reach.cursor == 1 and not other.lease.held
        assert not other.visibility.before_read().done  # never waits
        started = time.monotonic()
        assert other.reader().get_session("s0") is not None  # reads take no lock
        assert time.monotonic() - started < 3.0  # a lock wait would be the 5 s busy timeout
        assert not other.advance(log.head()[0], wait=0.1).done
    finally:
        holder.lease.release()
    assert other.advance(log.head()[0], wait=5).done
    holder.close()
    other.close()
    log.close()


def test_other_processes_appends_become_visible_with_a_follower(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    log.append([make_event("session.created", "s0", {})])
    directory = tmp_path / "p"
    p = Projector(directory, log, "p")
    p.advance()
    p.start_follower()
    reader = p.reader()
    writer = spawn(APPEND, tmp_path / "log", "hello", 20, stdin=True)
    assert writer.stdin is not None and writer.stdout is not None
    lags = []
    for i in range(20):
        writer.stdin.write("next\n")
        writer.stdin.flush()
        appended_at = float(writer.stdout.readline())
        while True:
            msgs = reader.get_messages("s0")
            if msgs and msgs[-1]["content"] == f"hello {i}":
                break
            assert time.monotonic() - appended_at < 5, "append never became visible"
            time.sleep(0.001)
        lags.append(time.monotonic() - appended_at)
    writer.wait(timeout=10)
    p.stop_follower()
    reader.close()
    p.close()
    log.close()
    lags.sort()
    assert lags[len(lags) // 2] < 1.0, lags  # bound ~ poll (20 ms) + apply; generous for loaded CI machines


FOLLOWER = """
import sys
from eventlog.log import EventLog
from projections import Projector
log = EventLog.open(sys.argv[1], durability="nosync", profile="p")
p = Projector(sys.argv[2], log, "p")
p.advance()
p.start_follower(poll=float(sys.argv[3]))
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_one_shot_reader_reads_everything_appended_before_it_started(tmp_path: Path) -> None:
    """A reader without a follower of its own brings the projections up to the log head as of its
    read, even while another process runs a follower (here one that sleeps between polls): a
    process started after a write always reads it."""
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    log.append([make_event("session.created", "s0", {})])
    directory = tmp_path / "p"
    follower = spawn(FOLLOWER, tmp_path / "log", directory, 60.0, stdin=True)  # applies once, then sleeps
    try:
        assert follower.stdout is not None and follower.stdout.readline().strip() == "ready"
        one_shot = Projector(directory, log, "p")
        assert one_shot.cursor() == 1
        log.append([make_event("message.appended", "s0", {"role": "user", "content": f"m{i}"}) for i in range(5)])
        reach = one_shot.visibility.before_read()
        assert reach.done and not reach.stale and one_shot.cursor() == 6
        assert [m["content"] for m in one_shot.reader().get_messages("s0")] == [f"m{i}" for i in range(5)]
        one_shot.close()
    finally:
        follower.send_signal(signal.SIGKILL)
        follower.wait(timeout=10)
    log.close()


LEASE_HOLDER = """
import sys
from pathlib import Path
from projections.lease import Lease
lease = Lease(Path(sys.argv[1]))
assert lease.acquire(timeout=5)
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_failing_or_stopped_follower_stops_counting(tmp_path: Path) -> None:
    from projections.lease import followed

    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    log.append([make_event("session.created", "s0", {})])
    p = Projector(tmp_path / "p", log, "p")
    assert not followed(p.dir)
    p.start_follower(poll=0.01)
    assert followed(p.dir)
    p.stop_follower()
    assert not followed(p.dir)
    calls = {"n": 0}

    def broken(*a: Any, **k: Any) -> int:
        calls["n"] += 1
        raise RuntimeError("disk on fire")

    p._healer.catch_up = broken  # type: ignore[method-assign]
    p.start_follower(poll=0.01)
    log.append([make_event("session.titled", "s0", {"title": "x"})])
    deadline = time.monotonic() + 5
    while calls["n"] == 0 or followed(p.dir):
        assert time.monotonic() < deadline, "a failing follower still claims to follow"
        time.sleep(0.01)
    p.close()
    log.close()


def test_a_stopped_lease_holder_delays_a_read_by_at_most_the_read_wait_and_the_read_says_stale(tmp_path: Path) -> None:
    """A process stopped (SIGSTOP, a debugger) while it holds the projector lease: a one-shot
    read waits at most READ_WAIT_S for it, then answers from the projections as they stand and
    says they are stale, naming the holder; once the holder is gone the next read is fresh."""
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(home=tmp_path, profile="p", follower=False) as s:
        s.create_session("s0")
        s.append_message("s0", "user", "before")
        assert len(s.get_messages("s0")) == 1  # a read: the projections now hold both events
    directory = tmp_path / "profiles" / "p"
    holder = spawn(LEASE_HOLDER, directory, stdin=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        holder.send_signal(signal.SIGSTOP)
        with SessionStore.open(home=tmp_path, profile="p", follower=False) as writer:
            writer.append_message("s0", "user", "while the holder is stopped")
        with SessionStore.open(home=tmp_path, profile="p", follower=False) as reader:
            started = time.monotonic()
            got = [m["content"] for m in reader.get_messages("s0")]
            waited = time.monotonic() - started
            status = reader.read_status()
        assert got == ["before"]
        assert waited < visibility_module.READ_WAIT_S + 0.5, waited
        assert status["stale"] and status["lease_holder"] == holder.pid and status["lease_holder_state"] == "stopped"
        assert status["projected_seq"] < status["log_seq"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.send_signal(signal.SIGCONT)
        holder.wait(timeout=10)
    with SessionStore.open(home=tmp_path, profile="p", follower=False) as reader:
        assert [m["content"] for m in reader.get_messages("s0")] == ["before", "while the holder is stopped"]
        assert not reader.read_status()["stale"]


WRITE_AND_EXIT = """
import sys
from eventlog.sessions.store import SessionStore
s = SessionStore.open(home=sys.argv[1], profile="p", follower=False)
s.append_message("s0", "user", "from a one-shot writer")
s.close()
"""


def test_a_writer_that_exits_pays_nothing_and_the_next_reader_reads_its_appends(tmp_path: Path) -> None:
    """A one-shot writer does not bring the projections up to date before it exits (no reader
    needs it yet); the next process's read does, even with a (sleeping) follower elsewhere."""
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(home=tmp_path, profile="p", follower=False) as s:
        s.create_session("s0")
    directory = tmp_path / "profiles" / "p"
    follower = spawn(FOLLOWER, directory / "log", directory, 60.0, stdin=True)  # applies once, then sleeps
    try:
        assert follower.stdout is not None and follower.stdout.readline().strip() == "ready"
        subprocess.run([sys.executable, "-c", WRITE_AND_EXIT, str(tmp_path)], check=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
        line = json.dumps({"type": "message.appended", "session": "s0",
                           "data": {"role": "assistant", "content": "from eventlog append"}})
        subprocess.run([sys.executable, "-c", "from eventlog.cli import main; main()", "--home", str(tmp_path),
                        "--profile", "p", "append"], input=line + "\n", text=True, check=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, stdout=subprocess.DEVNULL)
        log = EventLog.open(directory / "log", profile="p")
        reader = Projector(directory, log, "p")
        assert reader.cursor() == 1 and log.head()[0] == 3  # the writers left the projections alone
        assert reader.visibility.before_read().done  # the reader applied their appends itself
        assert [m["content"] for m in reader.reader().get_messages("s0")] == [
            "from a one-shot writer", "from eventlog append"]
        reader.close()
        log.close()
    finally:
        follower.send_signal(signal.SIGKILL)
        follower.wait(timeout=10)
