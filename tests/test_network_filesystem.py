"""An LMDB log is never opened on a network filesystem (DESIGN.md: "Never on NFS").

LMDB's lock table and memory map are not coherent across the hosts of an NFS, SMB or sshfs
share: two writers on two hosts would both commit — the "second writer corrupts the file"
failure. Every way in (the log, a SessionStore, the CLI, the Hermes facade) refuses such a
directory before creating anything there, naming the filesystem and the way out.

The real-mount tests mount a FUSE file system whose mount table entry reads ``fuse.sshfs``, as
a real sshfs mount does (``fixtures_fs.fuse_mount``); it can create nothing, so an open that
reached the disk before the check would fail with "Function not implemented" instead.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_fs import fuse_mount

from eventlog import SessionStore
from eventlog.errors import StorageError
from eventlog.log.filesystem import ALLOW_ENV, mount_of, network_mount
from eventlog.log.lmdb import EventLog

MOUNTINFO = (
    "22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
    "40 22 0:45 / /home rw,relatime shared:20 - nfs4 server:/export/home rw,vers=4.2\n"
    "41 40 252:2 / /home/alice/local rw,relatime shared:21 - ext4 /dev/vdb1 rw\n"
    "42 22 0:46 / /mnt/c\\040drive rw,noatime - 9p drvfs rw,aname=drvfs;path=C:\\134\n"
    "43 22 0:47 / /srv rw - cifs //nas/share rw\n"
    "44 22 0:48 / /srv rw - tmpfs tmpfs rw\n"
    "45 22 0:49 / /media/usb rw - fuseblk /dev/sdb1 rw\n"
    "46 22 0:50 / /net/box rw - fuse.sshfs me@box:/ rw\n"
)


@pytest.mark.parametrize("path, expected, network", [
    ("/home/alice/.eventlog/profiles/p/log", ("/home", "nfs4"), True),
    ("/home/alice/local/.eventlog/log", ("/home/alice/local", "ext4"), False),  # a local disk mounted inside the share
    ("/home2/x", ("/", "ext4"), False),  # a prefix of a mount point's name is not inside it
    ("/mnt/c drive/Users/me/.hermes/state.db", ("/mnt/c drive", "9p"), True),  # WSL's Windows drive
    ("/srv/eventlog", ("/srv", "tmpfs"), False),  # mounted over the share: the later mount hides it
    ("/media/usb/eventlog", ("/media/usb", "fuseblk"), False),  # a local disk through FUSE
    ("/net/box/eventlog", ("/net/box", "fuse.sshfs"), True),
])
def test_the_mount_table_decides(tmp_path: Path, path: str, expected: tuple[str, str], network: bool) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    assert mount_of(path, str(table)) == expected
    assert (network_mount(path, str(table)) is not None) is network


def test_an_unreadable_mount_table_refuses_nothing(tmp_path: Path) -> None:
    assert network_mount("/home/alice", str(tmp_path / "absent")) is None


@pytest.fixture
def share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with fuse_mount(tmp_path / "share", "sshfs") as where:
        yield where


def _names_the_share(error: BaseException, where: Path) -> None:
    text = f"{error} {getattr(error, 'hint', '')}"
    assert "network filesystem (fuse.sshfs" in text and str(where) in text, text
    assert "EVENTLOG_LOG_URL" in text and f"{ALLOW_ENV}=1" in text, text
    assert "eventlog export FILE" in text, text  # a backup to a share: an export, not a log copy


def test_the_log_refuses_a_share_before_creating_anything(share: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StorageError) as info:
        EventLog.open(share / "home" / "profiles" / "p" / "log")
    _names_the_share(info.value, share)
    with pytest.raises(StorageError) as info:
        SessionStore.open(share / "home", "p")
    _names_the_share(info.value, share)
    # The override opens it anyway: the open then reaches this share, which can create nothing.
    monkeypatch.setenv(ALLOW_ENV, "1")
    with pytest.raises(StorageError, match="Function not implemented"):
        EventLog.open(share / "home" / "profiles" / "p" / "log")


def test_the_cli_refuses_a_share(share: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (ALLOW_ENV, "EVENTLOG_LOG_URL")}
    res = subprocess.run([sys.executable, "-m", "eventlog.cli", "--home", str(share / "home"), "init"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode != 0
    assert "network filesystem (fuse.sshfs" in res.stderr and f"{ALLOW_ENV}=1" in res.stderr, res.stderr
    assert "Function not implemented" not in res.stderr, res.stderr


def test_the_hermes_facade_refuses_a_share(share: Path) -> None:
    from eventlog.adapters.hermes import SessionDB

    with pytest.raises(StorageError) as info:
        SessionDB(share / "state.db")
    _names_the_share(info.value, share)


def test_a_relative_log_path_is_judged_where_it_is_now(tmp_path: Path, share: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The mount table is read once per path a process opens (a store opened again does not
    read it again). The path was remembered as given: a relative one found local in one
    working directory was taken for local in another, on the share, and opened there."""
    monkeypatch.chdir(tmp_path)
    with EventLog.open("log") as lg:  # a local disk
        lg.append([{"type": "t.x", "session": None, "data": {}}])
    monkeypatch.chdir(share)
    with pytest.raises(StorageError) as info:
        EventLog.open("log")
    _names_the_share(info.value, share)
