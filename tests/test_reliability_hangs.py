"""Nothing hangs, nothing crashes — the campaign's three generators (a few runs by default, the
full figures with ``EVENTLOG_CAMPAIGN=1``):

- a frozen writer: a store writer (two threads appending, a follower projecting) stopped with
  SIGSTOP — the first stop while it holds the projector lease, the second while it holds the
  log's write lock, the others at random moments — while read-only commands run.
  Each must answer within 1 s beyond its own time on the live
  profile measured in the same run (the CLI's start-up is not the writer's fault); one that
  does not is counted ``hung``. ``EVENTLOG_FREEZES`` overrides the number of stops.
- a full disk at random moments: a profile on a small tmpfs filled with a filler of random size,
  a writer appending until the disk says no, then reads (which must answer), a write (a
  one-line DiskFullError or success), the space given back, and writes that work again.
- hostile paths and numbers: every CLI option that takes a number, a path or an id given a
  value from a hostile set (2^64, nan, -1, an empty string, /dev/null, /proc, a path through a
  file, 5,000 characters, ...). The answer is exit 0, 1 or 2 with at most one ``error:`` line.

Every answer is searched for a Python traceback (``tracebacks``).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from campaign import Child, size
from campaign.summary import note, record
from fixtures_fs import tmpfs

from eventlog.profiles import flock_holder
from eventlog.sessions.store import SessionStore

pytest_plugins = ["campaign.summary"]

EXE = str(Path(sys.executable).with_name("eventlog"))
PROFILE = "agent"
KILL_AFTER_S = 20.0

STORE_READ = ("import sys\nfrom eventlog.sessions.store import SessionStore\n"
              "with SessionStore.open(sys.argv[1], 'agent', follower=False) as s:\n"
              "    print(len(s.list_sessions()), len(s.search('probe')['results']))\n")


def reads(home: Path, out: Path) -> dict[str, list[str]]:
    base = [EXE, "--home", str(home), "--profile", PROFILE]
    return {
        "sessions list": base + ["sessions", "list", "--json"],
        "sessions show": base + ["sessions", "show", "seed", "--json"],
        "search": base + ["search", "probe", "--json"],
        "log verify": base + ["log", "verify"],
        "log tail": base + ["log", "tail", "--limit", "5"],
        "stats": base + ["stats", "--json"],
        "doctor": base + ["doctor", "--json"],
        "export": base + ["export", str(out)],
        "SessionStore.open": [sys.executable, "-c", STORE_READ, str(home)],
    }


_CWD = tempfile.mkdtemp(prefix="eventlog-cli-cwd-")
"""Where the commands run: a relative hostile path ("-", ".") lands here, never in the checkout."""


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str] | None]:
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=KILL_AFTER_S, cwd=_CWD)
    except subprocess.TimeoutExpired:
        return time.monotonic() - t0, None
    return time.monotonic() - t0, r


def has_traceback(r: subprocess.CompletedProcess[str] | None) -> bool:
    return r is not None and ("Traceback" in r.stderr or "Traceback" in r.stdout)


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    with SessionStore.open(home, PROFILE, follower=False) as s:
        s.create_session("seed", title="seed")
        for i in range(20):
            s.append_message("seed", "user", f"seed probe {i}")
    return home


def test_a_frozen_writer_never_holds_a_reader(seeded: Path, tmp_path: Path) -> None:
    rng = random.Random(14)
    stops = size(4, 100, "EVENTLOG_FREEZES")
    commands = reads(seeded, tmp_path / "export.jsonl")
    baseline = {name: timed(argv)[0] for name, argv in commands.items()}
    writer = Child("store_writer", seeded, PROFILE, "w", 2, 1_000_000, "projection")
    profile_dir = seeded / "profiles" / PROFILE
    held = {"the lease": 0, "the log's writer lock": 0}
    hung: list[str] = []
    tracebacks: list[str] = []
    worst = 0.0
    runs = 0
    try:
        assert writer.wait_line("ACK message.appended", 60) is not None, writer.stderr
        for n in range(stops):
            # The first two stops land while the writer holds the projector lease (a flock on the
            # profile directory), then the log's writer lock: at random moments alone, a run of 4
            # stops did not always catch it holding the lease.
            want = {0: profile_dir, 1: profile_dir / "log" / "writer.lock"}.get(n)
            for _ in range(2000):
                time.sleep(rng.uniform(0.0, 0.08) if want is None else rng.uniform(0.0, 0.005))
                writer.proc.send_signal(signal.SIGSTOP)
                if want is None or flock_holder(want) == writer.proc.pid:
                    break
                writer.proc.send_signal(signal.SIGCONT)
            else:
                pytest.fail(f"stop {n}: the writer was never caught holding {want.name} in 2,000 tries")
            held["the lease"] += flock_holder(profile_dir) == writer.proc.pid
            held["the log's writer lock"] += flock_holder(profile_dir / "log" / "writer.lock") == writer.proc.pid
            slow: dict[str, float] = {}
            try:
                names = list(commands) if n < 2 else rng.sample(list(commands), 2)
                for name in names:
                    took, r = timed(commands[name])
                    runs += 1
                    late = took - baseline[name]
                    worst = max(worst, late)
                    if r is None:
                        hung.append(f"stop {n}: {name} did not finish")
                    elif late > 1.0:
                        slow[name] = took
                    if has_traceback(r):
                        tracebacks.append(f"stop {n}: {name}: {r.stderr[-800:] if r else ''}")
                    if r is not None and r.returncode not in (0, 1):
                        tracebacks.append(f"stop {n}: {name} exited {r.returncode}: {r.stderr[-300:]}")
            finally:
                writer.proc.send_signal(signal.SIGCONT)
            # A read more than 1 s slower than its first live time is timed again now, the writer
            # live, so that a machine busy with other work (the suite's other workers) is not taken
            # for a reader held by the frozen writer: held, it is more than 1 s slower than that too.
            for name, took in slow.items():
                live, _ = timed(commands[name])
                if took - live > 1.0:
                    hung.append(f"stop {n}: {name} took {took:.2f} s (live: {baseline[name]:.2f} s, "
                                f"{live:.2f} s right after)")
    finally:
        writer.kill()
    record("frozen writer (SIGSTOP at random moments): reads", runs=runs, passed=runs - len(hung) - len(tracebacks),
           hung=len(hung), tracebacks=len(tracebacks))
    note(f"frozen writer: {stops} stops ({', '.join(f'{v} holding {k}' for k, v in held.items())}), {runs} reads, "
         f"the slowest {worst:.2f} s beyond its live time")
    assert not hung and not tracebacks, "\n".join(hung + tracebacks)


# ------------------------------------------------------------------ a full disk at random moments

@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", "24m") as where:
        yield where


FILL_WRITER = """
import os, random, sys
from eventlog.sessions.store import SessionStore
from eventlog.errors import DiskFullError
rng = random.Random(int(sys.argv[2]))
vocab = [os.urandom(4).hex() for _ in range(5000)]
n = 0
with SessionStore.open(sys.argv[1], 'agent') as s:
    try:
        while n < 10_000:
            words = rng.randrange(20, 40_000)  # a vocabulary of 5,000 words: text-like for the index
            s.append_message('seed', 'user', 'probe ' + ' '.join(vocab[rng.randrange(5000)] for _ in range(words)))
            n += 1
    except DiskFullError:
        print('FULL', n, flush=True)
    print('READS', len(s.list_sessions()), flush=True)
"""


def test_a_full_disk_at_random_moments_never_stops_reads(seeded: Path, small_fs: Path) -> None:
    rng = random.Random(28)
    home = small_fs / "home"
    rounds = size(2, 20, "EVENTLOG_FULL_DISKS")
    base = [EXE, "--home", str(home), "--profile", PROFILE]
    problems: list[str] = []
    tracebacks = hung = failed_rounds = 0
    for n in range(rounds):
        before = len(problems)
        shutil.rmtree(home, ignore_errors=True)  # each round starts from the seeded profile: the log
        shutil.copytree(seeded, home, symlinks=True)  # written in one round would fill the next
        free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
        filler = small_fs / "filler"
        with open(filler, "wb") as f:
            f.truncate(0)
        os.truncate(filler, 0)
        leave = rng.randrange(0, 3 * 1024 * 1024)
        with open(filler, "r+b", buffering=0) as f:
            try:
                f.write(b"\0" * max(0, free - leave))
            except OSError:
                pass
        child = subprocess.run([sys.executable, "-c", FILL_WRITER, str(home), str(n)], capture_output=True, text=True,
                               timeout=120)
        if has_traceback(child) or child.returncode != 0:
            tracebacks += 1
            problems.append(f"round {n}: the writer: {child.returncode} {child.stderr[-800:]}")
        for args in (["sessions", "list", "--json"], ["search", "probe", "--json"], ["sessions", "show", "seed"],
                     ["stats"], ["doctor"], ["messages", "add", "seed", "--role", "user", "--content", "x" * 5000]):
            took, r = timed(base + args)
            if r is None:
                hung += 1
                problems.append(f"round {n}: {args[:2]} did not answer in {KILL_AFTER_S} s")
                continue
            if has_traceback(r):
                tracebacks += 1
                problems.append(f"round {n}: {args[:2]}: {r.stderr[-800:]}")
            writes = args[0] in ("messages", "doctor")
            if r.returncode != 0 and not writes:
                problems.append(f"round {n}: {args[:2]} exited {r.returncode}: {r.stderr[-300:]}")
            if writes and r.returncode != 0 and len([x for x in r.stderr.splitlines() if x.startswith("error:")]) != 1:
                problems.append(f"round {n}: {args[:2]} failed without one error line: {r.stderr[-300:]}")
        filler.unlink()
        r = subprocess.run(base + ["messages", "add", "seed", "--role", "user", "--content", f"room again {n}"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            problems.append(f"round {n}: a write after the space returned failed: {r.stderr[-300:]}")
        strays = [x for x in os.listdir(home / "profiles" / PROFILE) if ".tmp" in x]
        if strays:
            problems.append(f"round {n}: temp files left: {strays}")
        r = subprocess.run(base + ["doctor"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            problems.append(f"round {n}: doctor once the space returned: {r.stdout[-500:]} {r.stderr[-300:]}")
        failed_rounds += len(problems) > before
    record("full disk at random moments", runs=rounds, passed=rounds - failed_rounds, hung=hung, tracebacks=tracebacks)
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ hostile paths and numbers

NUMBERS = ["18446744073709551616", "99999999999999999999999", "-1", "-9223372036854775809", "nan", "inf", "1e309",
           "0x10", "", " 7", "½", "9223372036854775807", "0"]
# Devices are copies made in the test's folder ({null}, {full}), never /dev's own: a regression
# that replaced an output by rename must not take the machine's /dev/null with it (one did).
PATHS = ["", "{null}", "/proc/eventlog-x", "{file}/x", "/", "{missing}/x", "x" * 5000, "{dir}", "{full}", "{file}", "-"]
TEXTS = ["", "x" * 300, "../..", "\u202e", "-", "a b", "ü" * 50, "s1\tx", "{file}"]
# What each command needs besides the option under test, and the options to vary (option: kind).
CASES: dict[tuple[str, ...], tuple[list[str], dict[str, str]]] = {
    ("log", "tail"): ([], {"--from": "n", "--limit": "n"}),
    ("sessions", "list"): ([], {"--limit": "n", "--workspace": "p", "--source": "t"}),
    ("sessions", "show"): (["{id}"], {"ID": "t"}),
    ("sessions", "new"): ([], {"--id": "t", "--parent": "t", "--cwd": "p", "--title": "t"}),
    ("sessions", "title"): (["seed", "{value}"], {"TITLE": "t"}),
    ("search", "probe"): ([], {"--limit": "n", "--session": "t", "--role": "t"}),
    ("replay",): (["--out", "{tmp}/r.db"], {"--until": "n", "--as-of": "t", "--out": "p"}),
    ("export",): (["{tmp}/e.jsonl"], {"OUT": "p", "--session": "t"}),
    ("import",): ([], {"FILE": "p"}),
    ("messages", "add", "seed", "--role", "user"): (["--content", "c"], {"--content-file": "p", "--tool-name": "t"}),
    ("log", "copy"): ([], {"--to": "p", "--from": "p"}),
    ("retention", "--dry-run"): ([], {"--older-than": "t"}),
}
GLOBAL = {"--home": "p", "--profile": "t"}


def hostile(rng: random.Random, kind: str, tmp: Path) -> str:
    value = rng.choice({"n": NUMBERS, "p": PATHS, "t": TEXTS}[kind])
    return value.format(file=tmp / "plain", missing=tmp / "missing", dir=tmp, null=tmp / "null", full=tmp / "full")


def test_hostile_paths_and_numbers_in_every_option(seeded: Path, tmp_path: Path) -> None:
    rng = random.Random(99)
    (tmp_path / "plain").write_text("not a folder\n")
    import stat

    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(tmp_path / "full", 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except OSError:  # not root: FIFOs stand in (special files all the same)
        os.mkfifo(tmp_path / "null")
        os.mkfifo(tmp_path / "full")
    n_cases = size(30, 600, "EVENTLOG_HOSTILE")
    keys = list(CASES)
    problems: list[str] = []
    tracebacks = hung = 0
    for n in range(n_cases):
        if rng.random() < 0.15:
            option, kind = rng.choice(sorted(GLOBAL.items()))
            value = hostile(rng, kind, tmp_path)
            argv = [EXE, option, value] + (["--profile", PROFILE] if option == "--home" else ["--home", str(seeded)])
            argv += ["sessions", "list"]
        else:
            cmd = rng.choice(keys)
            needed, options = CASES[cmd]
            option, kind = rng.choice(sorted(options.items()))
            value = hostile(rng, kind, tmp_path)
            rest = [a.format(tmp=tmp_path, value=value, id=value) for a in needed]
            if option.isupper():  # a positional argument: the value stands in its place
                if option not in ("ID", "TITLE"):
                    rest = [value] + [a for a in rest if not a.startswith(str(tmp_path))]
            else:
                rest = [option, value] + [a for i, a in enumerate(rest)
                                          if not (option == "--out" and (a == "--out" or rest[i - 1] == "--out"))]
            argv = [EXE, "--home", str(seeded), "--profile", PROFILE, *cmd, *rest]
        took, r = timed(argv)
        shown = " ".join(a if len(a) < 40 else a[:20] + "..." for a in argv[1:])
        if r is None:
            hung += 1
            problems.append(f"{shown}: no answer in {KILL_AFTER_S} s")
            continue
        if has_traceback(r):
            tracebacks += 1
            problems.append(f"{shown}: {r.stderr[-600:]}")
        elif r.returncode not in (0, 1, 2):
            problems.append(f"{shown}: exit {r.returncode}")
        elif r.returncode == 1 and len([x for x in r.stderr.splitlines() if x.startswith("error:")]) != 1:
            problems.append(f"{shown}: exit 1 without one error line: {r.stderr[-300:]!r}")
    record("hostile paths and numbers over CLI options", runs=n_cases, passed=n_cases - len(problems), hung=hung,
           tracebacks=tracebacks)
    for name in ("null", "full"):
        if not (tmp_path / name).is_char_device() and not (tmp_path / name).is_fifo():
            problems.append(f"the special file {name} was replaced by a command")
    assert not problems, "\n".join(problems[:20])


HOLD_LEASE = """
import sys, time
from pathlib import Path
from projections.lease import Lease
lease = Lease(Path(sys.argv[1]))
assert lease.acquire(timeout=5)
print('HELD', flush=True)
time.sleep(120)
"""


def test_a_stopped_lease_holder_is_named_by_reads_and_by_doctor(seeded: Path) -> None:
    """A process stopped while it holds the projector lease: a one-shot read answers at once
    from the projections as they stand and says ``stale`` naming the pid; doctor exits 1."""
    profile_dir = seeded / "profiles" / PROFILE
    base = [EXE, "--home", str(seeded), "--profile", PROFILE]
    assert subprocess.run(base + ["sessions", "list"], capture_output=True, timeout=30).returncode == 0  # projected
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LEASE, str(profile_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        holder.send_signal(signal.SIGSTOP)
        r = subprocess.run(base + ["messages", "add", "seed", "--role", "user", "--content", "late probe"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        took, r = timed(base + ["sessions", "show", "seed", "--json"])
        assert r is not None and r.returncode == 0 and not has_traceback(r), r
        body = json.loads(r.stdout)
        assert body.get("stale") is True and f"process {holder.pid} (stopped)" in r.stderr, (body.get("stale"), r.stderr)
        assert r.stderr.count("warning:") == 1
        r = subprocess.run(base + ["doctor", "--json"], capture_output=True, text=True, timeout=30)
        report = json.loads(r.stdout)
        assert r.returncode == 1 and report["lease"]["ok"] is False and report["lease"]["holder"] == holder.pid
        assert report["lease"]["holder_state"] == "stopped"
        r = subprocess.run(base + ["doctor"], capture_output=True, text=True, timeout=30)
        assert f"process {holder.pid} (stopped) holds the projector lease" in r.stdout
        # the remedy is the holder's, not --fix's (which cannot take the lease it holds)
        assert f"kill -CONT {holder.pid}" in r.stderr and "doctor --fix" not in r.stderr, r.stderr
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    r = subprocess.run(base + ["sessions", "show", "seed", "--json"], capture_output=True, text=True, timeout=30)
    body = json.loads(r.stdout)
    assert "stale" not in body and body["messages"][-1]["content"] == "late probe"
    assert subprocess.run(base + ["doctor"], capture_output=True, text=True, timeout=30).returncode == 0


def test_a_stopped_lease_holder_holds_no_reader_of_a_process_that_writes(seeded: Path) -> None:
    """A process that writes while a stopped process holds the projector lease: its reads waited
    30 s for their own writes and then failed, a rule write (a title) failed the same way
    without naming the holder, and a store with a follower read the projections as they stood
    and said they were not stale (found by an outside audit). Now reads answer within about a
    second, flagged stale; the title write is WriterBusyError naming the stopped pid."""
    from eventlog.errors import WriterBusyError

    profile_dir = seeded / "profiles" / PROFILE
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LEASE, str(profile_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        holder.send_signal(signal.SIGSTOP)
        for follower in (False, True):
            with SessionStore.open(seeded, PROFILE, follower=follower) as store:
                sid = store.create_session(source="cli")
                seq = store.append_message(sid, "user", f"written while the holder is stopped {follower}")
                started = time.monotonic()
                messages = store.get_messages(sid)
                took = time.monotonic() - started
                status = store.read_status()
                assert took < 5 and status["stale"] is True and status["lease_holder"] == holder.pid, (took, status)
                assert seq not in [m["id"] for m in messages]  # what the projections hold: said to be stale
                started = time.monotonic()
                with pytest.raises(WriterBusyError) as busy:
                    store.set_title(sid, f"a title {follower}")
                assert time.monotonic() - started < 5 and busy.value.pid == holder.pid
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    with SessionStore.open(seeded, PROFILE, follower=False) as store:
        assert not store.read_status().get("stale")
        assert any(m["content"].startswith("written while") for s in store.list_sessions(limit=None)
                   for m in store.get_messages(s["id"]))


def test_a_store_with_a_follower_says_stale_on_a_full_disk(tmp_path: Path) -> None:
    """With the disk full the projections stop short of the log; a store with its own follower
    trusted it and said its reads were not stale, missing its own acknowledged writes (found by
    an outside audit). Both kinds of store now say stale."""
    import json

    code = """
import json, sys
from eventlog import SessionStore
with SessionStore.open(sys.argv[1], 'p', follower=sys.argv[2] == 'True') as s:
    sid = s.create_session(source='cli') if sys.argv[2] == 'True' else s.list_sessions()[0]['id']
    acked, err = [], None
    for i in range(100000):
        try:
            acked.append(s.append_message(sid, 'user', 'x' * 2000 + ' n%d' % i))
        except Exception as e:
            err = type(e).__name__
            break
    ids = [m['id'] for m in s.get_messages(sid, limit=3)]
    print(json.dumps({'acked': acked[-1] if acked else None, 'err': err, 'ids': ids, 'status': s.read_status()}))
"""
    with tmpfs(tmp_path / "fs", "16m") as where:
        (where / "filler").write_bytes(b"\0" * (6 << 20))
        (where / "spare").write_bytes(b"\0" * (4 << 20))
        for follower in (True, False):
            if not follower:
                # The first run filled the disk, and the second one's first read brings the
                # projections up to the log first: without room for that and an append or two,
                # its first append failed and there was nothing to check (1 run in 3 under load).
                # Under a heavier load the first run's follower fell 2,554 events behind (5 MB of
                # messages), more than the spare held: the filler goes too, so the catch-up
                # always fits and the second run's appends then fill the disk themselves.
                (where / "spare").unlink()
                (where / "filler").unlink()
            r = subprocess.run([sys.executable, "-c", code, str(where / "home"), str(follower)], capture_output=True,
                               text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            res = json.loads(r.stdout.strip().splitlines()[-1])
            assert res["err"] == "DiskFullError" and res["acked"], res
            assert res["acked"] in res["ids"] or res["status"]["stale"] is True, (follower, res)


def test_a_snapshot_onto_a_full_disk_is_one_typed_error(seeded: Path, tmp_path: Path) -> None:
    """replay --out and export --format sqlite onto a full file system ended in a traceback of
    sqlite3.OperationalError (found by an outside audit): now DiskFullError, one line, nothing left."""
    from eventlog.errors import DiskFullError

    with tmpfs(tmp_path / "fs", "1m") as where:
        (where / "filler").write_bytes(b"\0" * (900 << 10))
        with SessionStore.open(seeded, PROFILE, follower=False) as store:
            with pytest.raises(DiskFullError):
                store.snapshot(where / "snap.db")
        base = [EXE, "--home", str(seeded), "--profile", PROFILE]
        for args in (["replay", "--until", "3", "--out", str(where / "r.db")], ["export", "--format", "sqlite",
                                                                                str(where / "s.db")]):
            r = subprocess.run(base + args, capture_output=True, text=True, timeout=60)
            assert r.returncode == 1 and not has_traceback(r) and r.stderr.startswith("error: "), r.stderr
            assert "disk is full" in r.stderr
        assert sorted(p.name for p in where.iterdir()) == ["filler"]


def test_a_file_size_limit_is_room_not_damage(tmp_path: Path) -> None:
    """Under `ulimit -f` SQLite reports EFBIG as a disk I/O error: reads took it for a damaged
    projection, rebuilt, and died in a traceback (found by an outside audit). It reads as no
    room: reads serve what the projections hold, flagged stale, with one warning."""
    import resource

    home = tmp_path / "home"
    with SessionStore.open(home, "p", follower=False) as store:
        store.create_session(id="s1", source="cli")

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (600 << 10, 600 << 10))

    code = """
import json, os, sys
from eventlog import SessionStore
with SessionStore.open(sys.argv[1], 'p', follower=False) as s:
    n = 0
    for i in range(100000):
        try:
            s.append_message('s1', 'user', os.urandom(1500).hex())
            n += 1
        except Exception as e:
            break
    got = s.get_messages('s1', limit=2)
    print(json.dumps({'appended': n, 'stale': s.read_status()['stale']}))
"""
    r = subprocess.run([sys.executable, "-c", code, str(home)], capture_output=True, text=True, timeout=120,
                       preexec_fn=limited)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["appended"] > 10 and res["stale"] is True, res
    r = subprocess.run([EXE, "--home", str(home), "--profile", "p", "sessions", "list"], capture_output=True, text=True,
                       timeout=60, preexec_fn=limited)
    assert r.returncode == 0 and not has_traceback(r) and "file-size limit" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([EXE, "--home", str(home), "--profile", "p", "sessions", "show", "s1", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and len(json.loads(r.stdout)["messages"]) == res["appended"]  # no limit: caught up


def test_appends_on_a_read_only_file_system_are_disk_full_errors(tmp_path: Path) -> None:
    """On a read-only file system an append failed with 'cannot open the log's writer lock' (a
    StorageError) where the docs promise DiskFullError, and one to a session the projections
    had not reached yet said the session was not found (found by an outside audit)."""
    from eventlog.errors import DiskFullError

    with tmpfs(tmp_path / "fs", "16m") as where:
        home = where / "home"
        with SessionStore.open(home, "p", follower=False) as store:
            store.create_session(id="s_projected", source="cli")
            store.list_sessions()
        r = subprocess.run([EXE, "--home", str(home), "--profile", "p", "sessions", "new", "--id", "s_new"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        try:
            with SessionStore.open(home, "p") as store:
                for sid in ("s_projected", "s_new"):
                    with pytest.raises(DiskFullError):
                        store.append_message(sid, "user", "x")
                assert {s["id"] for s in store.list_sessions()} >= {"s_projected"}
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(where)], check=True)


_HOLD_AND_STOP = """
import os, signal, sys
from pathlib import Path
from projections.lease import Lease
assert Lease(Path(sys.argv[1])).acquire(0)
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_sync_behind_a_stopped_lease_holder_says_how_far_it_got(tmp_path: Path) -> None:
    """sync() answered the log head while the read model stood below it (another process holding
    the projector lease was stopped), so a caller took stale rows for current ones: an adapter
    then hid a saved item (found by an outside audit). It returns the seq the model reached."""
    from eventlog.errors import process_state

    with SessionStore.open(tmp_path, "p", follower=False) as store:
        sid = store.create_session(source="cli")
        first = store.append_message(sid, "user", "one")
        assert store.sync(timeout=5) == first
        holder = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, str(tmp_path / "profiles" / "p")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            deadline = time.monotonic() + 10
            while process_state(holder.pid) != "stopped":
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with SessionStore.open(tmp_path, "p", follower=False) as other:  # another writer of the profile
                second = other.append_message(sid, "user", "two")
            reached = store.sync(timeout=5)
            assert reached == first < second == store.log.head()[0]
        finally:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()
        assert store.sync(timeout=5) == second
