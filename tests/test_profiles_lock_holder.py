"""Who holds a profile's lock, read from /proc/locks: a lock on another file system's file with
the same inode number is not this one's (two tmpfs mounts hand out the same numbers)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_fs import tmpfs

from eventlog.profiles import flock_holder

EXE = str(Path(sys.executable).with_name("eventlog"))

HOLD = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[2], os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(sys.argv[2]) else 0))
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
if sys.argv[1] == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
sys.stdin.read()
"""


def _holder(how: str, path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, how, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/locks is Linux's")
def test_a_stopped_process_locking_another_file_systems_same_inode_is_not_the_lease_holder(tmp_path: Path) -> None:
    """flock_holder matched /proc/locks by inode number alone: a process stopped while holding a
    directory on another tmpfs with the lease directory's inode number was named the holder, and
    doctor said "process X (stopped) holds the projector lease ... reads are stale" while the real
    holder ran. The device now has to match too."""
    with tmpfs(tmp_path / "m1", "16m") as m1, tmpfs(tmp_path / "m2", "16m") as m2:
        env = {k: v for k, v in os.environ.items() if k != "EVENTLOG_LOG_URL"}
        base = [EXE, "--home", str(m1 / "home"), "--profile", "p"]
        assert subprocess.run([*base, "sessions", "new", "--id", "s1"], env=env, capture_output=True,
                              timeout=60).returncode == 0
        lease_dir = m1 / "home" / "profiles" / "p"
        twin = None
        for n in range(5000):  # the second tmpfs numbers its inodes from the same start
            (m2 / f"d{n}").mkdir()
            if (m2 / f"d{n}").stat().st_ino == lease_dir.stat().st_ino:
                twin = m2 / f"d{n}"
                break
        assert twin is not None and twin.stat().st_dev != lease_dir.stat().st_dev
        live = _holder("live", lease_dir)
        stopped = _holder("stop", twin)
        try:
            assert flock_holder(twin) == stopped.pid
            assert flock_holder(lease_dir) == live.pid
            r = subprocess.run([*base, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120)
            lease = json.loads(r.stdout)["lease"]
            assert lease["holder"] == live.pid and lease["holder_state"] == "running", lease
        finally:
            for proc in (stopped, live):
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
