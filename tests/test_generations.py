"""No leftovers (issue 17): a replaced projection generation is deleted as soon as no process
holds it, and a process SIGKILLed while deleting generations, or while rebuilding, loses nothing
and leaves no file the next open does not remove. Real processes, real files."""
from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from eventlog.log import EventLog
from eventlog.sessions.events import make_event
from eventlog.sessions.fold import Fold
from projections import Projector, files
from projections.site import SCHEMAS
from projections.testing import answers, checkpoint, diff

ROOT = Path(__file__).resolve().parent.parent
SIDS = ["a", "b", "c", "d"]

SWEEP = """
import sys
from pathlib import Path
from projections import files
from projections.site import SCHEMAS
print("ready", flush=True)
files.collect(Path(sys.argv[1]), SCHEMAS)
print("done", flush=True)
"""

REBUILD = """
import sys
from eventlog.log import EventLog
from projections import Projector, build
build.BULK_FLUSH = 20  # many commits of the state file, each indexed beside it: kills land between them
log = EventLog.open(sys.argv[1], durability="nosync", profile="p")
p = Projector(sys.argv[2], log, "p")
print("ready", flush=True)
while True:
    p.rebuild("all")
"""

HOLD = """
import fcntl, os, sys
fds = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    fds.append(fd)
print("ready", flush=True)
sys.stdin.read()
"""


def spawn(code: str, *args: Any) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[EventLog]:
    log = make_log(tmp_path)
    try:
        yield log
    finally:
        log.close()


def make_log(tmp: Path) -> EventLog:
    log = EventLog.open(tmp / "log", durability="nosync", profile="p")
    rng = random.Random(3)
    log.append([make_event("session.created", s, {}) for s in SIDS])
    for i in range(300):
        sid = rng.choice(SIDS)
        log.append([make_event("message.appended", sid, {"role": "user", "content": f"needle {i} 中文 {sid}"})])
    log.append([make_event("session.deleted", "d", {})])
    return log


def check(log: EventLog, directory: Path, held: frozenset[tuple[str, int]] = frozenset()) -> None:
    """Reads answer like the fold, and the only projection files left are the current
    generations and those another process holds (``held``), with their lock files and WAL
    sidecars, and the pointers."""
    fold = Fold()
    fold.apply_all(log.read())
    mids = list(range(1, log.head()[0] + 1, 7))
    with Projector(directory, log, "p") as p:
        p.heal()
        r = p.reader()
        got, expected = answers(r, SIDS, mids), answers(fold, SIDS, mids)
        assert got == expected, "\n".join(diff(expected, got)[:3])
        assert not r.search("needle")["degraded"]
        r.close()
        current = {(g.kind, g.gen) for g in (files.read_pointer(directory / f"{k}.db") for k in ("state", "fts")) if g}
        assert {(k, g) for k, g, _ in files.generation_files(directory)} == current | held
        for (kind, gen, schema), names in files.generation_files(directory).items():
            g = files.Generation(kind, gen, schema, directory / f"{kind}.{gen}.v{schema}.db")
            assert set(names) <= {g.name, f"{g.name}-wal", f"{g.name}-shm", files.lock_path(g).name}
        assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]


def test_sigkill_while_deleting_generations(tmp_path: Path, made: EventLog) -> None:
    """A sweep killed at random moments: the generations other processes hold and the current
    ones are never touched; every other generation ends up wholly deleted by a later sweep."""
    log = made
    directory = tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
    current = files.read_pointer(directory / "state.db")
    assert current is not None
    checkpoint(current.path)
    rng = random.Random(11)
    held, free = [], []
    for i in range(120):  # replaced generations: a database, WAL sidecars and a lock file each
        g = files.Generation("state", current.gen + 1 + i, current.schema,
                             directory / f"state.{current.gen + 1 + i}.v{current.schema}.db")
        shutil.copy(current.path, g.path)
        for sfx in ("-wal", "-shm"):
            Path(f"{g.path}{sfx}").write_bytes(b"x" * rng.randrange(100))
        files.lock_path(g).write_bytes(b"")
        (held if i % 10 == 0 else free).append(g)
    holder = spawn(HOLD, *(files.lock_path(g) for g in held))  # another process has these open
    try:
        ready(holder)
        for _ in range(12):
            sweep = spawn(SWEEP, directory)
            ready(sweep)
            time.sleep(rng.uniform(0, 0.03))
            kill(sweep)
        check(log, directory, frozenset((g.kind, g.gen) for g in held))  # heal() sweeps the rest...
        # ... except what the live holder holds, intact.
        assert set(files.generations(directory, "state")) >= set(held)
        for g in held:
            db = sqlite3.connect(f"file:{g.path}?mode=ro", uri=True)
            assert db.execute("SELECT count(*) FROM messages").fetchone()[0] > 0
            db.close()
        assert not any(Path(f"{g.path}{sfx}").exists() for g in free for sfx in ("", "-wal", "-shm"))
        assert not any(files.lock_path(g).exists() for g in free)
    finally:
        kill(holder)
    check(log, directory)  # the holder is gone: its generations go at the next open
    assert not any(g.path.exists() for g in held)


def test_sigkill_while_rebuilding(tmp_path: Path, made: EventLog) -> None:
    """A process rebuilding over and over, killed at random moments (mid-build, mid-swap,
    mid-cleanup): the next open serves every answer and leaves only the current files."""
    log = made
    directory = tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
    rng = random.Random(5)
    for round_ in range(8):
        proc = spawn(REBUILD, tmp_path / "log", directory)
        ready(proc)
        time.sleep(rng.uniform(0.02, 0.6))
        kill(proc)
        log.append([make_event("message.appended", "a", {"role": "user", "content": f"needle after {round_}"})])
        check(log, directory)


def test_a_replaced_generation_goes_when_its_last_reader_lets_go(tmp_path: Path, made: EventLog) -> None:
    log = made
    directory = tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
        r1, r2 = p.reader(), p.reader()
        assert r1.search("needle")["results"] and r2.search("needle")["results"]
        old_state = files.read_pointer(directory / "state.db")
        old_fts = files.read_pointer(directory / "fts.db")
        assert old_state and old_fts
        p.rebuild("all")
        assert old_state.path.exists() and old_fts.path.exists()  # both readers hold them
        r1.close()
        assert old_state.path.exists() and old_fts.path.exists()  # r2 still does
        assert r2.search("needle")["results"]  # r2 moves to the new generations, letting go
        assert old_state.path.exists()  # the projector's own reader (the read model's) still holds it
        p.cursor()  # ... until its next read (a follower makes one every 20 ms)
        assert not old_state.path.exists() and not old_fts.path.exists()
        assert not files.lock_path(old_state).exists() and not files.lock_path(old_fts).exists()
        r2.close()
    assert sorted(files.collect(directory, SCHEMAS)) == []


READ_CONN = """
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, isolation_level=None)
db.execute("SELECT count(*) FROM messages").fetchone()
print("ready", flush=True)
for line in sys.stdin:  # "begin": open a read transaction and keep it; "end": close it
    if line.strip() == "begin":
        db.execute("BEGIN")
        db.execute("SELECT count(*) FROM messages").fetchone()
    else:
        db.execute("COMMIT")
    print("ok", flush=True)
"""


def wal_bytes(directory: Path) -> int:
    total = 0
    for k in ("state", "fts"):
        g = files.read_pointer(directory / f"{k}.db")
        assert g is not None
        try:
            total += os.stat(f"{g.path}-wal").st_size
        except FileNotFoundError:
            pass
    return total


def until(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def test_an_idle_follower_empties_the_wals_other_processes_reading_on(tmp_path: Path, made: EventLog) -> None:
    """WALs are measured, not assumed: they grow while events arrive, and once the projector is
    idle they are cut to zero bytes — with another process's connection open (so SQLite's own
    delete-on-last-close cannot be what emptied them); a reader inside a read transaction
    postpones it until it ends."""
    log, directory = made, tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
        g = files.read_pointer(directory / "state.db")
        assert g is not None
        other = spawn(READ_CONN, g.path)
        try:
            ready(other)
            p.start_follower()
            for round_ in range(2):
                for i in range(200):
                    log.append([make_event("message.appended", "a", {"role": "user", "content": f"wal {round_} {i}"})])
                grown = until(lambda: wal_bytes(directory) > 0 and p.cursor() == log.head()[0], 5)
                assert grown, "the WALs never held anything: the check below would prove nothing"
                if round_ == 1:  # a reader in a transaction: the WAL must stay until it ends
                    assert other.stdin is not None and other.stdout is not None
                    other.stdin.write("begin\n")
                    other.stdin.flush()
                    assert other.stdout.readline().strip() == "ok"
                    time.sleep(1.5)  # three idle periods
                    assert wal_bytes(directory) > 0
                    other.stdin.write("end\n")
                    other.stdin.flush()
                    assert other.stdout.readline().strip() == "ok"
                assert until(lambda: wal_bytes(directory) == 0, 10), wal_bytes(directory)
            assert p.reader().search("wal 1 199")["results"]
        finally:
            kill(other)


def test_closing_a_writer_leaves_no_wal_behind(tmp_path: Path, made: EventLog) -> None:
    """A process that caught up and closes (no follower) empties the WALs, though another
    process still has the files open."""
    log, directory = made, tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
    g = files.read_pointer(directory / "state.db")
    assert g is not None
    other = spawn(READ_CONN, g.path)
    try:
        ready(other)
        p = Projector(directory, log, "p")
        for i in range(100):
            log.append([make_event("message.appended", "b", {"role": "user", "content": f"close {i}"})])
            p.advance()
        assert wal_bytes(directory) > 0
        p.close()
        assert wal_bytes(directory) == 0
    finally:
        kill(other)


HOLD_SCHEMA = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_SH)
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_generation_of_an_older_schema_goes_with_the_rebuild_that_replaced_it(tmp_path: Path, made: EventLog) -> None:
    # After a hot update, the rebuild of a projection of an older program's schema left that
    # program's file (and its WAL) behind until another process opened the profile: a
    # long-lived store kept it for its whole life, whatever its size (outside audit, helper-54).
    directory = tmp_path / "p"
    with Projector(directory, made, "p") as p:
        p.heal()
        cur = files.read_pointer(directory / "state.db")
        assert cur is not None
    older = directory / f"state.{cur.gen + 1}.v{cur.schema - 1}.db"
    checkpoint(cur.path)
    shutil.copy(cur.path, older)
    db = sqlite3.connect(older)
    db.execute(f"PRAGMA user_version = {cur.schema - 1}")
    db.commit()
    db.close()
    files.swap_pointer(directory / "state.db", files.parse(older))  # type: ignore[arg-type]
    holder = spawn(HOLD_SCHEMA, directory / f"state.v{cur.schema - 1}.lock")  # a process of that version
    try:
        ready(holder)
        with Projector(directory, made, "p") as p:
            p.heal()
            assert older.exists()  # it may be reading it
    finally:
        kill(holder)
    files.swap_pointer(directory / "state.db", files.parse(older))  # type: ignore[arg-type]
    with Projector(directory, made, "p") as p:
        p.heal()  # the one open: its sweep came before the rebuild
        assert files.read_pointer(directory / "state.db").schema == SCHEMAS["state"]  # type: ignore[union-attr]
        assert not [n for n in os.listdir(directory) if n.startswith(older.name)]
    check(made, directory)


OTHER_REBUILD = """
import sys
from eventlog.log import EventLog
from projections import Projector
with EventLog.open(sys.argv[1], durability="nosync", profile="p") as log, Projector(sys.argv[2], log, "p") as p:
    p.rebuild("all")
"""


def test_an_idle_follower_lets_go_of_the_generations_another_process_replaced(tmp_path: Path, made: EventLog) -> None:
    # A follower's write connection stayed on the generations another process's rebuild had
    # replaced until this process next wrote or closed: an idle gateway kept the old state.db,
    # fts.db and their WALs (outside audit, helper-54).
    log, directory = made, tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()
        old = [files.read_pointer(directory / f"{k}.db") for k in ("state", "fts")]
        p.start_follower()
        proc = spawn(OTHER_REBUILD, tmp_path / "log", directory)
        assert proc.wait(60) == 0
        assert all(g is not None and files.read_pointer(directory / f"{g.kind}.db") != g for g in old)
        assert until(lambda: not any(g is not None and g.path.exists() for g in old), 5)
        assert p.reader().search("needle")["results"]
    check(log, directory)


HOLD_LEASE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)  # the projector lease (projections/lease.py)
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_follower_that_met_the_lease_taken_lets_go_of_replaced_generations_later(tmp_path: Path,
                                                                                      made: EventLog) -> None:
    # The follower marked a swap as seen before it could let go of it: when the lease was taken at
    # that poll (the rebuilding process holds it right after its swap), it never tried again, and
    # an idle gateway kept the old state.db and fts.db (a fresh-clone CI run under load).
    log, directory = made, tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.advance()  # its write connection is on the first generations
        p._follow_step()  # idle polls: the first empties the WALs, the next ones look at the pointers
        p._follow_step()
        old = [files.read_pointer(directory / f"{k}.db") for k in ("state", "fts")]
        proc = spawn(OTHER_REBUILD, tmp_path / "log", directory)
        assert proc.wait(60) == 0
        holder = spawn(HOLD_LEASE, directory)
        try:
            ready(holder)
            p._follow_step()  # an idle poll sees the swap; the lease is taken
            assert all(g is not None and g.path.exists() for g in old)
        finally:
            kill(holder)
        p._follow_step()  # the next idle poll
        assert not [g for g in old if g is not None and g.path.exists()]
        assert p.reader().search("needle")["results"]
    check(log, directory)


def test_a_file_size_limit_far_above_every_file_does_not_stop_a_rebuild(tmp_path: Path, made: EventLog) -> None:
    # Any finite `ulimit -f` read as "no room": with a limit of gigabytes, a missing state.db was
    # never rebuilt (every read failed "state.db is unusable: missing") and doctor said the disk
    # was broken (outside audit, helper-54). A limit close to the files' sizes still is no room.
    code = (
        "import resource, sys\n"
        "from eventlog.log import EventLog\n"
        "from projections import Projector, space\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))\n"
        "print(space.cannot_write(sys.argv[2]))\n"
        "with EventLog.open(sys.argv[1], profile='p') as log, Projector(sys.argv[2], log, 'p') as p:\n"
        "    p.heal()\n"
        "    print(p.health()['state']['status'])\n")
    log, directory = made, tmp_path / "p"
    with Projector(directory, log, "p") as p:
        p.heal()
    made.close()
    os.unlink(directory / "state.db")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = [sys.executable, "-c", code, str(tmp_path / "log"), str(directory)]
    near = subprocess.run(run + [str(64 << 10)], capture_output=True, text=True, env=env, timeout=60)
    assert near.stdout.split("\n")[0].startswith("a file-size limit") and "Traceback" not in near.stderr
    far = subprocess.run(run + [str(8 << 30)], capture_output=True, text=True, env=env, timeout=60)
    assert far.stdout.split("\n")[:2] == ["None", "ok"], far.stdout + far.stderr
