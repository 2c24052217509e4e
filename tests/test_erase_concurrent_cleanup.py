"""Two erases of one session at once: the second finds nothing left to erase while the first is
still cleaning the files (compaction, purge). It took that unfinished record for the work of a
killed process: it warned so, and compacted the whole log a second time beside the first (outside
audit, helper-56). It now waits for the first's cleanup (the profile's erase lock) and looks again."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from eventlog.log.lmdb import generation_dir
from eventlog.sessions.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent

SLOW_ERASE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from eventlog.log import lmdb
    from eventlog.sessions.store import SessionStore

    compact = lmdb._Environment.compact
    def paused(self, *a, **k):
        Path(sys.argv[3]).write_text("erased")       # the erase is committed, its cleanup starts
        while not os.path.exists(sys.argv[4]):        # ... and waits for the test's go
            time.sleep(0.01)
        return compact(self, *a, **k)
    lmdb._Environment.compact = paused
    with SessionStore.open(sys.argv[1], "p", follower=False) as store:
        store.erase_session(sys.argv[2], "first")
""")


def test_a_second_erase_waits_for_the_first_cleanup_instead_of_doing_it_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with SessionStore.open(home, "p", follower=False) as store:
        victim = store.create_session(source="cli")
        keep = store.create_session(source="cli")
        for i in range(50):
            store.append_message(victim, "user", f"secret {i}")
            store.append_message(keep, "user", f"kept {i}")
    log_dir = home / "profiles" / "p" / "log"
    before = generation_dir(log_dir).name
    erased, go = tmp_path / "erased", tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.Popen([sys.executable, "-c", SLOW_ERASE, str(home), victim, str(erased), str(go)], env=env,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not erased.exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first erase never reached its cleanup"
            time.sleep(0.01)
        exe = str(Path(sys.executable).with_name("eventlog"))
        second = subprocess.Popen([exe, "--home", str(home), "--profile", "p", "sessions", "erase", victim,
                                   "--reason", "second"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert second.poll() is None, f"the second erase did not wait for the first's cleanup: {second.stderr.read()}"
        go.write_text("go")
        out, err = second.communicate(timeout=60)
        assert first.wait(timeout=60) == 0, first.stderr.read() if first.stderr else ""
    finally:
        go.write_text("go")
        first.kill()
    assert second.returncode == 0, err
    assert "finishing the cleanup" not in err, err
    # One compaction in all: the first erase's (each compaction makes the next generation).
    assert int(generation_dir(log_dir).name[1:]) == int(before[1:] if before.startswith("g") else 0) + 1
    with SessionStore.open(home, "p", follower=False) as store:
        assert store.get_session(victim) is None and len(store.get_messages(keep, limit=None)) == 50
        assert store.finish_erase() == 0
