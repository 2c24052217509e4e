"""Embedding: many SessionStore opens of one profile in one process share one log, projector and
follower; each closes on its own; nothing outlives the last one; a follower whose profile
disappears stops quietly; sequential processes read each other's writes without settling."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import ClosedError, NotFoundError, ValidationError
from eventlog.sessions import store as store_module
from eventlog.sessions.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent


def eventlog_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("eventlog"))


def test_three_libraries_share_one_profile_and_close_in_any_order(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    sids: dict[int, str] = {}
    barrier = threading.Barrier(3)

    def library(n: int) -> None:
        rng = random.Random(n)
        try:
            with SessionStore.open(tmp_path, "p", follower=n != 1, durability="nosync") as store:
                sid = store.create_session(source=f"lib{n}")
                sids[n] = sid
                barrier.wait()
                for i in range(20):
                    store.append_message(sid, "user", f"lib{n} says {i}")
                    assert len(store.get_messages(sid)) == i + 1  # read-your-writes per handle
                barrier.wait()
                assert {s["source"] for s in store.list_sessions()} >= {"lib0", "lib1", "lib2"}
                time.sleep(rng.random() / 20)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=library, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert store_module._shared == {} and eventlog_threads() == []
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        assert sorted(len(store.get_messages(s)) for s in sids.values()) == [20, 20, 20]


def test_handles_share_one_core_and_a_closed_one_refuses_use(tmp_path: Path) -> None:
    a = SessionStore.open(tmp_path, "p", durability="nosync")
    b = SessionStore.open(tmp_path, "p", follower=False, durability="nosync")
    try:
        assert a._core is b._core and a.log is b.log and a._core.refs == 2
        sid = a.create_session(source="cli")
        b.append_message(sid, "user", "from b")
        a.close()
        a.close()  # idempotent
        with pytest.raises(ClosedError):
            a.append_message(sid, "user", "after close")
        with pytest.raises(ClosedError):
            a.get_session(sid)
        assert [m["content"] for m in b.get_messages(sid)] == ["from b"]  # the other handle works on
        assert not b._core.projector.following  # the follower went with the only handle that asked for it
    finally:
        b.close()
    assert store_module._shared == {} and eventlog_threads() == []


FOLLOWER_CHILD = textwrap.dedent("""
    import sys, threading, time, logging
    logging.basicConfig(level=logging.WARNING)
    from eventlog.sessions.store import SessionStore
    store = SessionStore.open(sys.argv[1], "p")
    sid = store.create_session(source="cli")
    store.append_message(sid, "user", "hello")
    print("READY", flush=True)
    sys.stdin.readline()  # the profile folder is removed now
    t0 = time.monotonic()
    while any(t.name == "eventlog-projector" for t in threading.enumerate()) and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    alive = [t.name for t in threading.enumerate() if t.name == "eventlog-projector"]
    print("FOLLOWER", "alive" if alive else "gone", round(time.monotonic() - t0, 2), flush=True)
""")


def test_a_follower_whose_profile_disappears_stops_once_without_a_traceback(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", FOLLOWER_CHILD, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "READY"
    shutil.rmtree(tmp_path / "profiles" / "p")
    child.stdin.write("go\n")
    child.stdin.flush()
    out, err = child.communicate(timeout=30)
    word, state, seconds = out.split()
    assert (word, state) == ("FOLLOWER", "gone") and float(seconds) < 1.0, out
    assert "Traceback" not in err, err
    assert err.count("follower stops") == 1, err


EXIT_WITHOUT_CLOSE = textwrap.dedent("""
    import sys
    from eventlog.sessions.store import SessionStore
    store = SessionStore.open(sys.argv[1], "p")
    sid = store.create_session(source="cli")
    for i in range(50):
        store.append_message(sid, "user", f"m{i}")
    print(sid, flush=True)  # and exit with the store and its follower still open
""")


def test_interpreter_exit_with_stores_open_prints_nothing_and_loses_nothing(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, str(tmp_path)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        assert len(store.get_messages(r.stdout.strip())) == 50


def cli(home: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-c", "from eventlog.cli import main; main()", "--home", str(home),
                        "--profile", "p", *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_sequential_cli_processes_read_each_others_writes(tmp_path: Path) -> None:
    """`messages add` then `sessions show` in the next process shows the message — also while a
    long-lived process elsewhere runs a follower — though the writer does not settle its append."""
    gateway = subprocess.Popen([sys.executable, "-c", FOLLOWER_CHILD, str(tmp_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert gateway.stdout is not None and gateway.stdout.readline().strip() == "READY"
        sid = cli(tmp_path, "sessions", "new", "--source", "cli").split()[-1]
        for i in range(5):
            cli(tmp_path, "messages", "add", sid, "--role", "user", "--content", f"step {i}")
            shown = cli(tmp_path, "sessions", "show", sid, "--json")
            assert f"step {i}" in shown, shown
    finally:
        gateway.kill()
        gateway.wait()


@pytest.mark.parametrize("option", [{"map_size": -5}, {"map_size": "1G"}, {"batch_size": "x"}, {"batch_size": 0},
                                    {"check": "maybe"}, {"follower": "no"}])
def test_bad_open_options_are_validation_errors_naming_the_option(tmp_path: Path, option: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        SessionStore.open(tmp_path, "p", **option)
    assert info.value.field == next(iter(option))


def test_bad_arguments_and_a_closed_handle_of_a_shared_profile_are_refused(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        for field, call in (("which", lambda: store.rebuild("bogus")), ("timeout", lambda: store.sync("x")),
                            ("out", lambda: store.snapshot(tmp_path)),
                            ("out", lambda: store.snapshot(tmp_path / "no" / "such" / "x.db")),  # as the CLI
                            # a snapshot's prefix is named exactly (a float, a negative seq were taken)
                            *(("until_seq", lambda bad=bad: store.snapshot(tmp_path / "s.db", until_seq=bad))
                              for bad in ("5", 1.5, -1, 2**63, True)),
                            *(("as_of_ns", lambda bad=bad: store.snapshot(tmp_path / "s.db", as_of_ns=bad))
                              for bad in ("x", float("nan"), -1, 2**63))):
            with pytest.raises(ValidationError) as info:
                call()
            assert info.value.field == field
        assert not (tmp_path / "no").exists() and not (tmp_path / "s.db").exists()  # nothing creates missing folders
        other = SessionStore.open(tmp_path, "p", follower=False)  # the profile stays open through `store`
        other.close()
        for call in (other.sync, other.health, other.projection_lag, other.rebuild, lambda: other.version("s"),
                     lambda: other.snapshot(tmp_path / "x.db")):
            with pytest.raises(ClosedError):
                call()
        assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("how", ["delete", "erase"])
@pytest.mark.parametrize("follower", [False, True])
def test_a_session_deleted_by_another_process_takes_no_more_appends(tmp_path: Path, follower: bool, how: str) -> None:
    """A handle that already appended to a session (its fast path trusts what it saw) must not
    keep appending after another process deleted it: the appends would be acknowledged and
    never readable (found by an outside audit through EventlogSession). An erase changes no
    stream version: the log's erase mark says that one happened."""
    from eventlog.errors import NotFoundError

    s = SessionStore.open(tmp_path, follower=follower)
    try:
        s.create_session("chat-1")
        s.append_message("chat-1", "user", "a")
        s.record_usage("chat-1", model="m", input_tokens=1)
        args = ["sessions", "delete", "chat-1"] if how == "delete" else ["sessions", "erase", "chat-1", "--reason", "t"]
        r = subprocess.run([sys.executable, "-c", "from eventlog.cli import main; main()", "--home", str(tmp_path),
                            *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        head = s.log.head()[0]
        with pytest.raises(NotFoundError):
            s.append_message("chat-1", "user", "written after the delete")
        with pytest.raises(NotFoundError):
            s.record_usage("chat-1", model="m", input_tokens=1)
        assert s.log.head()[0] == head  # nothing appended
    finally:
        s.close()


class Remote:
    """A child process that creates or deletes sessions of the profile on request and answers at
    once, so that the parent acts a moment after the child's write (the narrowest window)."""

    def __init__(self, home: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import sys
            from eventlog.sessions.store import SessionStore
            s = SessionStore.open(sys.argv[1], follower=False)
            for line in sys.stdin:
                verb, sid = line.split()
                s.create_session(sid) if verb == "create" else s.delete_session(sid)
                print("ok", flush=True)
            s.close()
        """), str(home)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, verb: str, sid: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{verb} {sid}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _refused_after_remote_delete(s: SessionStore, remote: Remote, sid: str) -> bool:
    remote.ask("delete", sid)
    try:
        s.append_message(sid, "user", "written after the delete")
    except NotFoundError:
        return True
    return False


def test_an_append_right_after_another_process_deleted_the_session_is_refused(tmp_path: Path) -> None:
    """The refusal's recheck must see the deletion the refused version counted, not the read model
    as this process's follower last left it: a child deletes on command and answers at once, and
    the parent appends to the same session straight away, many times (without the catch-up this
    acknowledged most of those appends)."""
    s = SessionStore.open(tmp_path, follower=True)
    remote = Remote(tmp_path)
    try:
        acknowledged = []
        for i in range(25):
            sid = f"chat-{i}"
            s.create_session(sid)
            s.append_message(sid, "user", "a")
            if not _refused_after_remote_delete(s, remote, sid):
                acknowledged.append(sid)
        assert acknowledged == []
    finally:
        remote.close()
        s.close()


def test_a_child_of_a_session_another_process_just_deleted_is_refused(tmp_path: Path) -> None:
    """Creating a session under a parent checks the parent on the read model brought up to the log
    head, under the rules lock that deletions take: a child deletes the parent on command and
    answers at once, and the parent process's create under it right after must be refused
    (otherwise an orphan no delete would ever take, listed as live)."""
    s = SessionStore.open(tmp_path, follower=True)
    remote = Remote(tmp_path)
    try:
        orphans = []
        for i in range(25):
            parent = f"chat-{i}"
            s.create_session(parent)
            s.append_message(parent, "user", "a")
            remote.ask("delete", parent)
            try:
                orphans.append(s.create_session(f"child-{i}", parent_session_id=parent))
            except NotFoundError:
                pass
        assert orphans == []
        assert [x["id"] for x in s.list_sessions(limit=100)] == []
    finally:
        remote.close()
        s.close()


def test_a_first_append_to_a_session_another_process_just_deleted_is_refused(tmp_path: Path) -> None:
    """A session this store never appended to is checked on its read model as it stands (no
    catch-up wait) — plus the stream's events that model may not hold yet: a child creates a
    session, the parent's follower shows it, the child deletes it and answers at once, and the
    parent's first append to it must be refused."""
    s = SessionStore.open(tmp_path, follower=True)
    remote = Remote(tmp_path)
    try:
        acknowledged = []
        for i in range(25):
            sid = f"chat-{i}"
            remote.ask("create", sid)
            deadline = time.monotonic() + 30
            while s.get_session(sid) is None and time.monotonic() < deadline:
                time.sleep(0.005)
            if not _refused_after_remote_delete(s, remote, sid):
                acknowledged.append(sid)
        assert acknowledged == []
    finally:
        remote.close()
        s.close()


@pytest.mark.parametrize("expected", [False, True], ids=["plain", "at-a-version"])
def test_an_append_to_a_child_of_a_session_another_process_deleted_is_refused(tmp_path: Path, expected: bool) -> None:
    """A deletion takes the session's descendants with it, but it was one event in the parent's
    stream: a handle appending to a child at the child's stream version was not refused, and its
    appends were acknowledged into a session that no read could show. Each live descendant now
    gets a deletion of its own, in the same delete."""
    s = SessionStore.open(tmp_path, follower=True)
    try:
        s.create_session("root")
        s.create_session("child", parent_session_id="root")
        s.create_session("grandchild", parent_session_id="child")
        s.create_session("sibling")
        for sid in ("child", "grandchild", "sibling"):
            s.append_message(sid, "user", "before")
        version = s.version("root") if expected else None
        r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys
            from eventlog.sessions.store import SessionStore
            with SessionStore.open(sys.argv[1], follower=False) as other:
                other.delete_session("root", expected_version=None if sys.argv[2] == "-" else int(sys.argv[2]))
        """), str(tmp_path), "-" if version is None else str(version)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        head = s.log.head()[0]
        for sid in ("child", "grandchild"):
            with pytest.raises(NotFoundError):
                s.append_message(sid, "user", "written after the delete")
        assert s.log.head()[0] == head  # nothing appended
        s.append_message("sibling", "user", "after")
        assert [m["content"] for m in s.get_messages("sibling")] == ["before", "after"]
        assert {x["id"] for x in s.list_sessions()} == {"sibling"}
        deletions = [e["session"] for e in s.log.read() if e["type"] == "session.deleted"]
        assert deletions == ["root", "child", "grandchild"]
    finally:
        s.close()


def test_two_handles_appending_to_one_session_lose_nothing(tmp_path: Path) -> None:
    """The version-checked fast path under a second writer of the same stream: every append
    lands once, in each writer's order."""
    a = SessionStore.open(tmp_path, follower=False)
    try:
        a.create_session("shared")
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import sys
            from eventlog.sessions.store import SessionStore
            s = SessionStore.open(sys.argv[1], follower=False)
            for i in range(150):
                s.append_message("shared", "user", f"b{i}")
            s.close()
        """), str(tmp_path)])
        for i in range(150):
            a.append_message("shared", "user", f"a{i}")
        assert child.wait(timeout=120) == 0
        texts = [m["content"] for m in a.get_messages("shared")]
        assert sorted(texts) == sorted([f"a{i}" for i in range(150)] + [f"b{i}" for i in range(150)])
        assert [t for t in texts if t[0] == "a"] == [f"a{i}" for i in range(150)]
        assert [t for t in texts if t[0] == "b"] == [f"b{i}" for i in range(150)]
    finally:
        a.close()
