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
    """A home below a plain file: the OSError leaves as a StorageError with its cause, from the
    profile layer and from SessionStore.open alike."""
    from eventlog.sessions.store import SessionStore

    (tmp_path / "file").write_bytes(b"")
    home = tmp_path / "file" / "home"
    with pytest.raises(StorageError) as info:
        profile_dir(home, "p")
    assert isinstance(info.value.__cause__, NotADirectoryError) and info.value.hint
    with pytest.raises(StorageError):
        SessionStore.open(home, "p")
