"""profiles: the one atomic file write (temp file, fsync, rename, fsync dir) and the file modes."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventlog.errors import StorageError
from eventlog.profiles import (
    DIR_MODE,
    FILE_MODE,
    USER_FILE_MODE,
    atomic_write,
    make_dir,
    profile_dir,
    publish,
    temp_path,
)


def test_atomic_write_creates_a_private_file_with_the_data(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    old = os.umask(0)
    try:
        with atomic_write(target) as fp:
            fp.write(b"first")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"first"
    assert stat.S_IMODE(target.stat().st_mode) == FILE_MODE
    assert os.listdir(tmp_path) == ["out.bin"]


def test_a_user_file_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "export.jsonl", mode=USER_FILE_MODE) as fp:
            fp.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "export.jsonl").stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_write(target) as fp:
        fp.write(b"half of the new")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_publish_moves_a_symlink_over_a_name(tmp_path: Path) -> None:
    pointer = tmp_path / "state.db"
    os.symlink("a", pointer)
    tmp = temp_path(pointer)
    os.symlink("b", tmp)
    publish(tmp, pointer)
    assert os.readlink(pointer) == "b" and not tmp.exists()


def test_make_dir_creates_private_parents(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        make_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == DIR_MODE
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == DIR_MODE


WRITER = """
import sys
from eventlog.profiles import atomic_write
n = 0
print("READY", flush=True)
while True:
    n += 1
    body = (str(n) + "\\n") * (1000 + n % 7 * 3000)
    with atomic_write(sys.argv[1]) as fp:
        fp.write(body.encode())
"""


def test_a_writer_killed_at_any_moment_leaves_a_whole_file(tmp_path: Path) -> None:
    """SIGKILL a process rewriting one file in a loop: the file is always one complete version."""
    target = tmp_path / "counter"
    for round_ in range(8):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "READY"
        time.sleep(0.02 + round_ * 0.015)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        if not target.exists():
            continue
        lines = target.read_text().splitlines()
        assert lines and len(set(lines)) == 1, f"round {round_}: a mixed or empty file"
        n = int(lines[0])
        assert len(lines) == 1000 + n % 7 * 3000
    assert target.exists(), "no write completed in eight rounds"


def test_a_profile_directory_that_cannot_be_made_is_a_storage_error(tmp_path: Path) -> None:
    """A home below a plain file cannot be a home: refused by name before anything is made
    (ValidationError, field ``home``). A directory the file system will not make (under /proc):
    the OSError leaves as a StorageError with its cause, from the profile layer and from
    SessionStore.open alike."""
    from eventlog.errors import ValidationError
    from eventlog.sessions.store import SessionStore

    (tmp_path / "file").write_bytes(b"")
    home = tmp_path / "file" / "home"
    for call in (lambda: profile_dir(home, "p"), lambda: SessionStore.open(home, "p")):
        with pytest.raises(ValidationError) as refused:
            call()
        assert refused.value.field == "home" and "is not a directory" in str(refused.value)
    unmakeable = Path("/proc/eventlog-no-such-dir/home")
    with pytest.raises(StorageError) as info:
        profile_dir(unmakeable, "p")
    assert isinstance(info.value.__cause__, OSError) and info.value.hint
    with pytest.raises(StorageError):
        SessionStore.open(unmakeable, "p")


def test_nothing_is_written_through_a_symlink_in_the_profile(tmp_path: Path) -> None:
    """A lock file replaced by a (dangling) symlink made eventlog create its target outside the
    profile, even from a read-only command; a generation file replaced by a symlink to a file
    elsewhere was written through, and doctor said ok (found by an outside audit). Links in
    their place are replaced (the link, never its target) or the projection rebuilt."""
    import os
    import subprocess
    import sys

    from eventlog import SessionStore

    home, outside = tmp_path / "home", tmp_path / "elsewhere"
    outside.mkdir()
    with SessionStore.open(home, "p", follower=False) as store:
        sid = store.create_session(source="cli")
        store.append_message(sid, "user", "before")
    d = home / "profiles" / "p"
    links = [d / "projector.lock", d / "rules.lock", d / "log" / "writer.lock"]
    links += [p for p in d.glob("*.lock") if p not in links][:3]
    for i, lock in enumerate(links):
        lock.unlink(missing_ok=True)
        os.symlink(outside / f"lock{i}", lock)
    state = d / os.readlink(d / "state.db")
    moved = outside / "state-copy.db"
    os.rename(state, moved)
    os.symlink(moved, state)
    before = moved.read_bytes()
    exe = str(Path(sys.executable).with_name("eventlog"))
    for args in (["sessions", "list"], ["messages", "add", sid, "--role", "user", "--content", "after"],
                 ["sessions", "title", sid, "a title"], ["doctor", "--fix"]):
        r = subprocess.run([exe, "--home", str(home), "--profile", "p", *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)
    assert sorted(p.name for p in outside.iterdir()) == ["state-copy.db"], "nothing created outside the profile"
    assert moved.read_bytes() == before, "nothing written through the link"
    assert not any(p.is_symlink() for p in links if p.exists())
    r = subprocess.run([exe, "--home", str(home), "--profile", "p", "sessions", "show", sid, "--json"],
                       capture_output=True, text=True, timeout=60)
    import json

    assert [m["content"] for m in json.loads(r.stdout)["messages"]] == ["before", "after"]
