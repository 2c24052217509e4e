"""Review of the third round's fixes (outside audit, helper-63): edges the fixes missed, with real
processes (a lease holder stopped with SIGSTOP and resumed), real files and the real packages."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from eventlog.errors import process_state
from eventlog.log import open_log
from eventlog.sessions.store import SessionStore
from projections.projector import Projector

PROFILE = "agent"

_HOLD_THEN_RELEASE = """
import sys, time
from pathlib import Path
from projections.lease import Lease
lease = Lease(Path(sys.argv[1]))
assert lease.acquire(0)
print("held", flush=True)
time.sleep(1.5)
lease.release()
print("released", flush=True)
sys.stdin.read()
"""


def test_a_lease_holder_stopped_for_a_moment_is_waited_for_not_reported_stopped(tmp_path: Path) -> None:
    """The lease wait that no longer waits for a stopped holder gave up at its first look: a
    holder stopped for a moment (Ctrl-Z then `bg`, a debugger or profiler pausing it) made a
    rebuild, doctor --fix or a read healing a missing state.db fail with 'is stopped', though
    the holder went on and let the lease go a second later. Now a stop that ends within
    STOPPED_GRACE_S is waited for like a running holder: the rebuild takes the lease once it is
    let go and rebuilds every event."""
    home = tmp_path / "home"
    with SessionStore.open(home, PROFILE, follower=False) as s:
        s.create_session("seed", title="seed")
        for i in range(5):
            s.append_message("seed", "user", f"probe {i}")
    profile_dir = home / "profiles" / PROFILE
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_THEN_RELEASE, str(profile_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    log = open_log(profile_dir / "log")
    projector = Projector(profile_dir, log, PROFILE, lease_timeout=60.0)
    resume = threading.Timer(0.6, os.kill, (holder.pid, signal.SIGCONT))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)
        while process_state(holder.pid) != "stopped":
            time.sleep(0.01)
        resume.start()  # resumed well within the grace; it lets the lease go about a second later
        stats = projector.rebuild()
        assert stats["events"] == log.head()[0]
        assert holder.stdout.readline().strip() == "released"
    finally:
        resume.cancel()
        projector.close()
        log.close()
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()
