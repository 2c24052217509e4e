"""The console script in hostile environments: a file system too full (or read-only) to build
a missing projection, stdout on a full device. Each answer is one line that says what holds
and what to do; nothing acknowledged is lost.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_fs import tmpfs

EXE = str(Path(sys.executable).with_name("eventlog"))


def run(home: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=60,
                          **kw)  # type: ignore[call-overload]


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    if code == 1:
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr


@pytest.mark.parametrize("why", ["full", "read-only"])
def test_a_projection_that_cannot_be_built_for_want_of_room_says_so(tmp_path: Path, why: str) -> None:
    """A profile made on a file system with less room than a projection build needs has a log
    and no state.db: every read said "state.db is unusable: missing (hint: run `eventlog doctor
    --fix`)", and doctor --fix could not build it either. Now it names the full disk (or the
    read-only file system) and the remedy."""
    with tmpfs(tmp_path / "fs", "2m") as fs:
        home = fs / "h"
        assert run(home, "init").returncode == 0
        r = run(home, "sessions", "new", "--id", "s1")
        assert r.returncode == 0 and r.stdout == "s1\n", r.stderr
        if why == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        try:
            for args in (["sessions", "list"], ["search", "x"], ["stats"],
                         ["messages", "add", "s1", "--role", "user", "--content", "x"]):
                err = one_line_error(run(home, *args))
                assert "state.db is missing and cannot be built now" in err, err
                assert "doctor --fix" not in err, err
                assert ("make the file system writable" if why == "read-only" else "free some disk space") in err, err
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(fs)], capture_output=True)
        r = run(home, "log", "tail", "--json")
        assert r.returncode == 0 and r.stdout.count("\n") == 1, r.stderr  # the refused message was not appended
