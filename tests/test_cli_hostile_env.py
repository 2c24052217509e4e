"""The console script in hostile environments: a file system too full (or read-only) to build
a missing projection, stdout on a full device. Each answer is one line that says what holds
and what to do; nothing acknowledged is lost.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from fixtures_fs import tmpfs
from fixtures_users import EVENTLOG, nobody_folder

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


def stdout_to(target: str, home: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command with its stdout sent to ``target`` by a shell redirection (``>FILE``, ``>>FILE``)."""
    return subprocess.run(["sh", "-c", f'exec "$@" {target}', "sh", EXE, "--home", str(home), *args],
                          input=input, capture_output=True, text=True, timeout=60)


WRITES = [(["sessions", "new", "--id", "s2"], None),
          (["messages", "add", "s1", "--role", "user", "--content", "hi"], None),
          (["messages", "add", "s1", "--role", "user", "--content", "hi", "--json"], None),
          (["append"], '{"type": "session.created", "session": "s3", "data": {}}\n'),
          (["sessions", "title", "s1", "T"], None)]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args,stdin", WRITES)
def test_a_write_to_dev_full_is_a_usage_error_before_any_work(tmp_path: Path, args: list[str],
                                                              stdin: str | None) -> None:
    """`eventlog sessions new >/dev/full` made the session, then failed 'cannot use: No space left
    on device' (exit 1, read as nothing done: a retry made a second one). Now stdout is checked
    first, as a closed or read-only one is: a usage error naming it, nothing written."""
    home = tmp_path / "h"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    r = stdout_to(">/dev/full", home, *args, input=stdin)
    assert r.returncode == 2 and "Error: stdout is /dev/full" in r.stderr and "Traceback" not in r.stderr, r
    assert run(home, "log", "verify", "--json").stdout == head  # nothing was written


@pytest.mark.parametrize("args,stdin", WRITES)
def test_a_stdout_that_fills_up_says_the_work_is_done_and_what_the_report_was(tmp_path: Path, args: list[str],
                                                                              stdin: str | None) -> None:
    """Stdout appending to a file on a full file system (a check before the work cannot know
    whether its last block has room): the work is done once and the one-line error says so,
    with the report (the new id, the seqs) that stdout refused."""
    home = tmp_path / "h"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    before = run(home, "log", "tail", "--json").stdout.count("\n")
    with tmpfs(tmp_path / "fs", "1m") as fs:
        (fs / "out").write_bytes(b"x" * 4096)  # one whole page: the next byte needs another
        with open(fs / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
        r = stdout_to(f">>{fs / 'out'}", home, *args, input=stdin)
        assert (fs / "out").stat().st_size == 4096
    err = one_line_error(r)
    assert "the command did its work, but stdout refused the report of it (No space left on device)" in err, err
    assert "do not run the command again" in err
    tail = [json.loads(line) for line in run(home, "log", "tail", "--json").stdout.splitlines()]
    assert len(tail) == before + 1, tail  # done once
    said = err.split("the report: ", 1)[1]
    if args[0] == "sessions" and args[1] == "new":
        assert said.startswith("s2 (hint:"), err
    elif "--json" in args:
        assert said.startswith(f'{{"id":{tail[-1]["seq"]},"session_id":"s1"}} (hint:'), err
    elif args[0] == "append":
        assert said.startswith(f"{tail[-1]['seq']} (hint:"), err
    else:
        assert f"(event seq {tail[-1]['seq']})" in said or f"message {tail[-1]['seq']} " in said, err


def test_an_export_to_a_full_file_system_says_to_free_space(tmp_path: Path) -> None:
    """An export (jsonl, md) onto a full file system said 'No space left on device (hint: write
    to a folder of a regular, writable file system)', the hint for /proc, not for a full disk."""
    home = tmp_path / "h"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    assert run(home, "messages", "add", "s1", "--role", "user", "--content", "x" * 20000).returncode == 0
    with tmpfs(tmp_path / "fs", "1m") as fs:
        with open(fs / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
        for args in (["export", str(fs / "x.jsonl")], ["export", "--format", "md", "--session", "s1", str(fs / "x.md")]):
            err = one_line_error(run(home, *args))
            assert "No space left on device (hint: free some disk space there (or write it elsewhere)" in err, err
        assert sorted(p.name for p in fs.iterdir()) == ["filler"]  # no partial file left


def test_an_import_ended_by_sigterm_leaves_no_profile_behind(tmp_path: Path) -> None:
    """`kill` (a supervisor's stop, `timeout`) in the middle of an import into a new profile left
    that profile behind with an empty log, where a failed import (or Ctrl-C) leaves none. SIGTERM
    now ends a command as Ctrl-C does: what it began is undone, exit status 143 as before."""
    from eventlog.sessions.store import SessionStore

    source = tmp_path / "src"
    with SessionStore.open(source, "p", follower=False) as store:
        for i in range(10):
            sid = store.create_session(source="x")
            store.append_messages(sid, [{"role": "user", "content": f"message {i} {j} " * 20} for j in range(2000)])
    export = tmp_path / "x.jsonl"
    assert run(source, "--profile", "p", "export", str(export)).returncode == 0
    home = tmp_path / "h"
    child = subprocess.Popen([EXE, "--home", str(home), "import", str(export)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    profile = home / "profiles" / "default"
    while not profile.exists() and child.poll() is None:
        time.sleep(0.01)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    if child.returncode == 0:  # it was done before the signal came: all of it is there
        assert "imported=20010" in out, out
        return
    assert child.returncode == 143 and "Traceback" not in err, (child.returncode, err)
    assert not profile.exists(), os.listdir(profile)
    r = run(home, "import", str(export))
    assert r.returncode == 0 and "imported=20010" in r.stdout, r.stderr  # a second try needs nothing cleared


@pytest.fixture
def as_nobody() -> Iterator[tuple[Path, Callable[..., subprocess.CompletedProcess[str]], int]]:
    """``(home, cli, uid)``: ``cli(*args)`` runs eventlog as the user 'nobody' on ``home``, in a
    folder that user owns (``cli(*args, user=[])``: as root). Skipped, saying why, where another
    user cannot be had (``fixtures_users.nobody_folder``; CI runs as root)."""
    with nobody_folder("eventlog-user-") as (base, nobody, drop):
        home = base / "h"

        def cli(*args: str, user: list[str] = drop) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*user, sys.executable, "-c", EVENTLOG, "--home", str(home), *args],
                                  capture_output=True, text=True, timeout=60, cwd=base)

        yield home, cli, nobody.pw_uid


def test_a_profile_directory_this_user_may_not_write_in_is_read_as_it_stands(as_nobody: Any) -> None:
    """A profile directory this user may read but not write in (`chmod a-w`, a profile of another
    user shared read-only) was taken for damage: every read warned 'rebuilding state.db: attempt to
    write a readonly database' and failed 'cannot use .../..state.generation...tmp: Permission
    denied'; doctor said 'permissions ok' and hinted `doctor --fix`. It is now what a read-only
    file system is: the projections are served as they stand (stale, said once), the log is
    still appended to where it can be, and the hint says what to do."""
    home, cli, _uid = as_nobody
    assert cli("sessions", "new", "--id", "s1").returncode == 0
    assert cli("messages", "add", "s1", "--role", "user", "--content", "hello").returncode == 0
    assert cli("sessions", "list").returncode == 0  # (a one-shot's write reaches the projections at a read)
    profile = home / "profiles" / "default"
    profile.chmod(0o500)
    r = cli("search", "hello", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["results"]) == 1, r.stderr
    assert "rebuilding" not in r.stderr, r.stderr
    r = cli("messages", "add", "s1", "--role", "user", "--content", "later")
    assert r.returncode == 0 and r.stdout == "added message 3 to session s1\n", r.stderr
    r = cli("sessions", "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["message_count"] == 1, r.stderr  # as it stands
    assert f"the directory {profile} is read-only for this user" in r.stderr, r.stderr
    assert "let this user write in that directory" in r.stderr, r.stderr
    r = cli("doctor")
    assert r.returncode == 1 and "read-only for this user" in r.stdout, r.stdout
    assert "let this user write in that directory" in r.stderr and "doctor --fix" not in r.stderr, r.stderr
    profile.chmod(0o700)
    r = cli("sessions", "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["message_count"] == 2, r.stderr  # writable again: caught up


def test_a_projection_made_by_another_user_is_named_as_such_and_rebuilt(as_nobody: Any) -> None:
    """A read run as root on a user's profile (a cron job, sudo) builds state.db as root's file,
    0600: the user's next read rebuilt it saying 'state.N.v2.db is not readable and writable by its
    owner (mode 600)', which it is. It now says whose file it is and who is asking. (What a run
    as root makes in a user's profile is the user's now: tests/test_file_ownership.py; root's
    files are made here as a restore with sudo leaves them.)"""
    home, cli, uid = as_nobody
    assert cli("sessions", "new", "--id", "s1").returncode == 0
    assert cli("sessions", "list").returncode == 0
    (home / "profiles" / "default" / "state.db").unlink()
    assert cli("sessions", "list", user=[]).returncode == 0  # root rebuilds it (made the user's since)
    for p in (home / "profiles" / "default").glob("state.*"):
        os.lchown(p, 0, 0)  # root's, as a restore with sudo leaves them
    r = cli("sessions", "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["id"] == "s1", r.stderr
    assert f"belongs to another user (uid 0, mode 600), not to this one (uid {uid})" in r.stderr, r.stderr
    assert "by its owner" not in r.stderr, r.stderr


def test_a_failed_import_never_removes_a_profile_another_process_has_open(tmp_path: Path) -> None:
    """Two imports of one export into a new profile at once: the second gave up on the first's
    long write (WriterBusyError after 10 s), found the log still empty and removed the profile
    directory under the first, whose 'imported=40040' then went with it (helper-76). The clean-up
    of a failed import now leaves a profile whose log another process has open (LMDB's shared
    lock on lock.mdb), or that was written meanwhile. Here: a process holding the new profile's
    log open, not yet written, while a failed import's clean-up runs; then it appends."""
    from eventlog.cli.common import Ctx
    from eventlog.cli.transfer import _remove_if_empty
    from eventlog.log import EventLog

    home = tmp_path / "h"
    log_dir = home / "profiles" / "default" / "log"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom eventlog.log import EventLog\n"
         "with EventLog.open(sys.argv[1], profile='default') as lg:\n"
         "    print('open', flush=True); sys.stdin.readline()\n"
         "    print(lg.append([{'type': 't.x', 'data': {}}])[0], flush=True)", str(log_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        _remove_if_empty(Ctx(str(home), "default"), home / "profiles" / "default")
        assert log_dir.is_dir(), "the clean-up removed a profile another process has open"
        out, _ = holder.communicate("go\n", timeout=60)
        assert out == "1\n"
    finally:
        if holder.poll() is None:
            holder.kill()
    with EventLog.open(log_dir) as lg:
        assert lg.head()[0] == 1  # the append acknowledged is there
    _remove_if_empty(Ctx(str(home), "default"), home / "profiles" / "default")
    assert log_dir.is_dir()  # written: kept, as before
