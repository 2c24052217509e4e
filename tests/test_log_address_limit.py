"""A log opened under an address-space limit smaller than its memory map (``ulimit -v``): LMDB
maps the whole map size at open, so the open fails with ENOMEM. It said "Cannot allocate memory"
and to check the profile directory's disk and permissions (outside audit, helper-87); it names
the limit now, and a map_size under the limit opens."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

LIMIT = 900 * 1024 * 1024


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    return subprocess.run([sys.executable, "-m", "eventlog.cli", "--home", str(home), *args], capture_output=True,
                          text=True, env=env, preexec_fn=_limited, timeout=120)


def test_an_open_beyond_the_address_space_limit_names_the_limit(tmp_path: Path) -> None:
    done = _cli(tmp_path, "sessions", "new", "--id", "s1")
    assert done.returncode == 1 and done.stdout == ""
    assert "does not fit this process's address-space limit (ulimit -v: 900 MiB)" in done.stderr, done.stderr
    assert "map_size" in done.stderr and "permissions" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_map_under_the_limit_opens(tmp_path: Path) -> None:
    code = ("from eventlog import SessionStore\n"
            f"with SessionStore.open({str(tmp_path)!r}, follower=False, map_size=64 << 20) as s:\n"
            "    sid = s.create_session(source='cli'); s.append_message(sid, 'user', 'hi')\n"
            "    print(len(s.get_messages(sid)))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          preexec_fn=_limited, timeout=120)
    assert done.returncode == 0 and done.stdout == "1\n", done.stderr
