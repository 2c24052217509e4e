"""An erase on a full disk. Its record and stubs are committed first; the compaction that takes
the words out of the log's free pages and the purge of the projections come after, and need
room. When they failed, the CLI ended in the driver's traceback (``lmdb.Error: mdb_txn_commit:
Input/output error``, ``sqlite3.OperationalError: database or disk is full``) saying nothing of
the erase; and an erase refused up front because the projections could not catch up read "the
log at .../projector.lock is being written by another process" with no other process about
(outside audit, helper-52). Now: one line each, the disk named, the erase's state and the way
to finish it said; once there is room, the retry leaves no trace."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from eventlog.sessions.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_fs import tmpfs  # noqa: E402
from test_erase import MARKER, traces  # noqa: E402

EXE = str(Path(sys.executable).with_name("eventlog"))
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def build(home: Path) -> str:
    with SessionStore.open(home, "p", follower=False, durability="nosync") as store:
        secret = store.create_session(source="cli")
        store.append_messages(secret, [{"role": "user", "content": f"{MARKER} {i} " + " ".join(
            WORDS[(i * j) % 10] for j in range(150))} for i in range(300)])
        other = store.create_session(source="cli")
        store.append_messages(other, [{"role": "user", "content": f"x{i} " + " ".join(
            WORDS[(i + j) % 10] for j in range(150))} for i in range(3000)])
        store.search("alpha")  # the projections hold everything
    return secret


def fill(fs: Path, leave: int) -> Path:
    filler = fs / "filler"
    st = os.statvfs(fs)
    filler.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "--home", str(home), "--profile", "p", *args], capture_output=True, text=True,
                          timeout=120)


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.startswith("error: "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def test_an_erase_whose_cleanup_meets_a_full_disk_says_so_and_the_retry_finishes_it(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "24m") as fs:
        home = fs / "home"
        secret = build(home)
        filler = fill(fs, 300_000)
        err = one_line(cli(home, "sessions", "erase", secret, "--reason", "asked"))
        assert "is recorded" in err and "disk is full" in err and "retry the erase" in err, err
        doctor = cli(home, "doctor", "--json")
        assert doctor.returncode == 1 and json.loads(doctor.stdout)["log"]["erase_pending"], doctor.stdout
        filler.unlink()
        again = cli(home, "sessions", "erase", secret, "--reason", "asked again")
        assert again.returncode == 0, again.stderr
        assert traces(home) == []
        doctor = cli(home, "doctor", "--json")
        assert doctor.returncode == 0 and json.loads(doctor.stdout)["log"]["erase_pending"] is None, doctor.stdout
        with SessionStore.open(home, "p", follower=False) as store:
            assert store.log.verify().ok and store.get_session(secret) is None
            assert len(store.get_messages(store.list_sessions()[0]["id"], limit=None)) == 3000


def test_an_erase_refused_on_a_full_disk_names_the_disk(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "24m") as fs:
        home = fs / "home"
        secret = build(home)
        with SessionStore.open(home, "p", follower=False, durability="nosync") as store:
            other = store.create_session(source="cli")  # the projections are behind the log now...
            store.append_messages(other, [{"role": "user", "content": " ".join(WORDS) * 20} for _ in range(200)])
            head = store.log.head()[0]
        fill(fs, 0)  # ...and cannot catch up
        err = one_line(cli(home, "sessions", "erase", secret, "--reason", "asked"))
        assert "disk is full" in err and "being written by" not in err and "nothing was written" in err, err
        with SessionStore.open(home, "p", follower=False, read_model="fold") as store:
            assert store.log.head()[0] == head
