"""A process stopped (SIGSTOP) while it holds a lock, seen from other processes: no read waits for
it, and a write that needs the lock fails with a typed error naming it instead of waiting for as
long as it stays stopped; once it is resumed or killed everything goes on and nothing it
acknowledged is lost (outside audit, helper-82). Real processes, real signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from eventlog.adapters.hermes import SessionDB
from eventlog.errors import WriterBusyError, process_state
from eventlog.log.lmdb import EventLog

ROOT = Path(__file__).resolve().parent.parent

# The prelude of a writer that stops itself (SIGSTOP) the first time an event is sealed: inside
# the log's write transaction, nothing committed yet (install it with codec.seal = stopping_seal).
_STOP_AT_SEAL = """
    import os, signal, sys
    from eventlog.log import codec
    seal = codec.seal
    def stopping_seal(*a, **k):
        codec.seal = seal
        os.kill(os.getpid(), signal.SIGSTOP)
        return seal(*a, **k)
"""

# A Hermes writer that stops itself inside its write: the projection lease held, the log's
# write transaction begun (the first event sealed), nothing committed yet.
_HERMES_WRITER_STOPPED_MID_WRITE = _STOP_AT_SEAL + """
    from eventlog.adapters.hermes import SessionDB
    db = SessionDB(db_path=sys.argv[1])
    codec.seal = stopping_seal
    print(db.append_message("s1", "user", "the stopped writer's message"), flush=True)
    db.close()
"""


def wait_stopped(p: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while process_state(p.pid) != "stopped":
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the child never reached its stop"
        time.sleep(0.02)


@pytest.fixture
def stopped_hermes_writer(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    path = tmp_path / "state.db"
    db = SessionDB(db_path=path)
    db.create_session("s1", "cli")
    db.append_message("s1", "user", "before")
    db.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_HERMES_WRITER_STOPPED_MID_WRITE), str(path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_stopped(p)
        yield path, p
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()


def in_thread(fn: Any, seconds: float) -> tuple[bool, list[Any]]:
    """Run ``fn`` in a thread for at most ``seconds``: (finished, [result or exception])."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - the exception is the answer under test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive(), out


def append_in_new_handle(path: Path) -> int:
    db = SessionDB(db_path=path)
    try:
        return db.append_message("s1", "user", "written beside the stopped one")
    finally:
        db.close()


def test_a_hermes_write_behind_a_stopped_writer_fails_naming_it_and_reads_answer(
        stopped_hermes_writer: tuple[Path, subprocess.Popen[str]]) -> None:
    """A Hermes write waited on the projection lease (a kernel flock, no timeout) for as long as
    the writer holding it stayed stopped: a gateway's writes hung behind a one-shot ``hermes``
    command suspended with Ctrl-Z. It now fails with WriterBusyError naming the stopped holder
    once that holder has stayed stopped for STOPPED_GRACE_S; reads answer meanwhile."""
    path, holder = stopped_hermes_writer
    reader = SessionDB(db_path=path)
    assert [m["content"] for m in reader.get_messages("s1")] == ["before"]  # a read never waits
    reader.close()
    gateway = SessionDB(db_path=path)  # a long-lived handle: it writes again once the holder is gone
    done, out = in_thread(lambda: gateway.append_message("s1", "user", "written beside the stopped one"), 20)
    if not done:
        holder.kill()  # lets the waiting write go on, so that the test ends
    assert done, "a Hermes write waited for a stopped writer for as long as it stayed stopped"
    assert isinstance(out[0], WriterBusyError), out
    assert out[0].pid == holder.pid and out[0].stopped
    assert f"kill -CONT {holder.pid}" in (out[0].hint or "")

    holder.send_signal(signal.SIGCONT)
    stdout, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 0, stderr
    acknowledged = int(stdout.split()[-1])
    # The wait that gave up left nothing holding the lease: another process writes at once.
    other = subprocess.run([sys.executable, "-c", "import sys; from eventlog.adapters.hermes import SessionDB; "
                            "db = SessionDB(db_path=sys.argv[1]); print(db.append_message('s1', 'user', 'other')); "
                            "db.close()", str(path)], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert other.returncode == 0, other.stderr
    db = SessionDB(db_path=path)
    messages = {m["id"]: m["content"] for m in db.get_messages("s1")}
    assert messages[acknowledged] == "the stopped writer's message" and "other" in messages.values()
    assert "written beside the stopped one" not in messages.values()  # the refused write wrote nothing
    assert gateway.append_message("s1", "user", "after") > acknowledged
    gateway.close()
    assert [m["content"] for m in db.get_messages("s1")][-1] == "after"
    db.close()
    with EventLog.open(path.parent / "state.db.eventlog" / "profiles" / "default" / "log") as log:
        assert log.verify().ok


def test_a_hermes_write_after_the_stopped_writer_is_killed_goes_through(
        stopped_hermes_writer: tuple[Path, subprocess.Popen[str]]) -> None:
    path, holder = stopped_hermes_writer
    holder.kill()
    holder.wait()
    done, out = in_thread(lambda: append_in_new_handle(path), 20)
    assert done and isinstance(out[0], int), out
    db = SessionDB(db_path=path)
    assert [m["content"] for m in db.get_messages("s1")] == ["before", "written beside the stopped one"]
    db.close()


# A store writer that stops itself inside its append: the log's writer lock and LMDB's write
# transaction held, nothing committed.
_STORE_WRITER_STOPPED_MID_APPEND = _STOP_AT_SEAL + """
    from eventlog import SessionStore
    with SessionStore.open(home=sys.argv[1], profile="p") as store:
        codec.seal = stopping_seal
        print(store.append_message("s1", "user", "the stopped writer's message"), flush=True)
"""


def test_later_writes_give_up_at_once_on_a_stopped_writer_already_waited_for(tmp_path: Path) -> None:
    """Each write waited the whole lock timeout for the same stopped writer: a call that writes
    several times (a LangGraph ``invoke``: a checkpoint, then its writes) took 2-3 times 10 s
    before failing. A write that waited its timeout for a stopped holder is remembered; the next
    ones of this process give up at once while that holder still holds the lock stopped and the
    log has not moved, and wait as usual once it has."""
    from eventlog import SessionStore

    home = tmp_path / "home"
    with SessionStore.open(home=home, profile="p") as store:
        store.create_session(id="s1")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_STORE_WRITER_STOPPED_MID_APPEND), str(home)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_stopped(holder)
        with SessionStore.open(home=home, profile="p", lock_timeout=1) as store:
            with pytest.raises(WriterBusyError) as first:
                store.append_message("s1", "user", "first try")
            assert first.value.pid == holder.pid and first.value.stopped and not first.value.again
            for text in ("second try", "third try"):
                with pytest.raises(WriterBusyError) as again:
                    store.append_message("s1", "user", text)
                assert again.value.pid == holder.pid and again.value.stopped and again.value.again
                assert "gave up at once" in str(again.value) and f"kill -CONT {holder.pid}" in (again.value.hint or "")
            holder.send_signal(signal.SIGCONT)
            stdout, stderr = holder.communicate(timeout=60)
            assert holder.returncode == 0, stderr
            acknowledged = int(stdout.split()[-1])
            after = store.append_message("s1", "user", "after")  # the log moved: waited for as usual
            contents = {m["id"]: m["content"] for m in store.get_messages("s1")}
            assert contents == {acknowledged: "the stopped writer's message", after: "after"}
            assert store.log.verify().ok
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()


# A rebuild that stops itself while it collects the generation it replaced: the generation's
# lock file held exclusively (its deletion under way), the projector lease held too.
_REBUILD_STOPPED_WHILE_COLLECTING = """
    import os, signal, sys
    import projections.files as files
    from eventlog import SessionStore
    old = sys.argv[2]
    remove = files.remove_file
    def stopping_remove(path):
        if str(path) == old:
            os.kill(os.getpid(), signal.SIGSTOP)
        return remove(path)
    files.remove_file = stopping_remove
    with SessionStore.open(home=sys.argv[1], profile="p") as store:
        store.rebuild("state")
"""


def test_a_hold_on_a_generation_being_collected_by_a_stopped_process_does_not_wait(tmp_path: Path) -> None:
    """A reader that had read the state pointer just before a rebuild swapped it took a shared
    flock on that generation's lock file, blocking, while the rebuild's collection held it
    exclusively to delete it: with the collecting process stopped there, the read waited for as
    long as it stayed stopped. The hold now never waits: a generation being collected is not
    held (None), and the reader reads the pointer again."""
    import projections.files as files
    from eventlog import SessionStore

    home = tmp_path / "home"
    with SessionStore.open(home=home, profile="p") as store:
        store.create_session(id="s1")
        store.append_message("s1", "user", "hello")
        assert store.get_messages("s1")
    profile = home / "profiles" / "p"
    old = files.read_pointer(files.canonical_pointer(profile, "state"))
    assert old is not None
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    collector = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_REBUILD_STOPPED_WHILE_COLLECTING),
                                  str(home), str(old.path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_stopped(collector)
        assert files.read_pointer(files.canonical_pointer(profile, "state")) != old  # swapped, collecting
        done, out = in_thread(lambda: files.hold(old), 10)
        if not done:
            collector.kill()  # lets the waiting hold go on, so that the test ends
        assert done, "a hold on a generation being collected waited for the stopped collector"
        assert out == [None]  # being collected: not held, the reader takes the pointer again
        fd, g = files.hold_pointed(files.canonical_pointer(profile, "state"))
        assert fd is not None and g is not None and g != old
        files.release(fd, None)
        collector.send_signal(signal.SIGCONT)
        _, stderr = collector.communicate(timeout=60)
        assert collector.returncode == 0, stderr
        assert not old.path.exists()
        with SessionStore.open(home=home, profile="p") as store:
            assert [m["content"] for m in store.get_messages("s1")] == ["hello"]
    finally:
        if collector.poll() is None:
            collector.kill()
        collector.communicate()


# Holds the Hermes projection lease (an exclusive flock on the hermes/ directory, as a writer
# holds it while it writes) until a line comes on stdin; a running process, not a stopped one.
_LEASE_HOLDER = """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
"""

# A long-lived Hermes handle (a gateway, an interactive CLI) whose write, queued behind the
# lease's holder, is interrupted with Ctrl-C; it catches KeyboardInterrupt and goes on.
_INTERRUPTED_WRITER = """
    import signal, sys
    # Ctrl-C raises KeyboardInterrupt even when this process was started with SIGINT ignored
    # (a background job of a non-interactive shell, as CI's run is: the test hung there).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import faulthandler
    faulthandler.register(signal.SIGUSR1)  # where it waits, if an interrupt is ever not taken
    from eventlog.adapters.hermes import SessionDB
    db = SessionDB(db_path=sys.argv[1])
    print("open", flush=True)
    try:
        db.append_message("s1", "user", "the interrupted write")
        print("written", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()
    db.close()
    print("closed", flush=True)
    sys.stdin.readline()
"""


def queued_on(directory: Path, pid: int) -> bool:
    """Whether ``pid`` waits in the kernel's queue for a flock on ``directory`` (/proc/locks)."""
    ino = os.stat(directory).st_ino
    with open("/proc/locks", encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 7 and parts[1] == "->" and parts[2] == "FLOCK" and parts[5] == str(pid) \
                    and parts[6].split(":")[-1] == str(ino):
                return True
    return False


def test_an_interrupted_wait_for_the_hermes_lease_leaves_the_lease_to_others(tmp_path: Path) -> None:
    """A Hermes write queued behind a running holder of the projection lease and interrupted
    (Ctrl-C: KeyboardInterrupt in the waiting call) left its waiter thread claimed: once the
    holder let go, that thread took the lease and kept it for nobody, and every other process's
    writes then waited for as long as the interrupted handle stayed open -- and after its close
    too (close only abandons a waiter that has not got the lock). The interrupted wait now walks
    away like one that gave up: the lock, when it comes, is let go of at once."""
    path = tmp_path / "state.db"
    db = SessionDB(db_path=path)
    db.create_session("s1", "cli")
    db.close()
    hermes = path.parent / "state.db.eventlog" / "profiles" / "default" / "hermes"
    assert hermes.is_dir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_LEASE_HOLDER), str(hermes)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_INTERRUPTED_WRITER), str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    assert holder.stdin is not None and holder.stdout is not None
    assert writer.stdin is not None and writer.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        assert writer.stdout.readline().strip() == "open"
        deadline = time.monotonic() + 60
        while not queued_on(hermes, writer.pid):
            assert writer.poll() is None and time.monotonic() < deadline, "the write never queued on the lease"
            time.sleep(0.02)
        writer.send_signal(signal.SIGINT)
        done, out = in_thread(writer.stdout.readline, 30)
        if not (done and out[0].strip() == "interrupted"):
            writer.send_signal(signal.SIGUSR1)
            time.sleep(1)
            writer.kill()
            raise AssertionError(f"the interrupted write: {out}; its stderr: {writer.communicate()[1]}")
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        # The interrupted handle stays open; another process writes at once.
        done, out = in_thread(lambda: append_in_new_handle(path), 20)
        if not done:
            writer.kill()  # lets the waiting write go on, so that the test ends
        assert done, "the lease stayed with the interrupted handle's waiter"
        assert isinstance(out[0], int), out
        writer.stdin.write("\n")
        writer.stdin.flush()
        done, out = in_thread(writer.stdout.readline, 30)
        assert done and out[0].strip() == "closed", out
        assert isinstance(append_in_new_handle(path), int)
    finally:
        for p in (holder, writer):
            if p.poll() is None:
                p.kill()
            p.communicate()
    db = SessionDB(db_path=path)
    contents = [m["content"] for m in db.get_messages("s1")]
    db.close()
    assert contents == ["written beside the stopped one"] * 2  # the interrupted write wrote nothing


def lease_waiters() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "eventlog-hermes-lease")


def test_handles_closed_after_giving_up_on_a_stopped_writer_leave_one_waiter_thread(
        stopped_hermes_writer: tuple[Path, subprocess.Popen[str]]) -> None:
    """Each wait that gives up on a stopped holder leaves its waiter thread (and its descriptor)
    queued in the kernel until the holder lets go; a new handle's lease made a new one, so a
    program opening a SessionDB per request while a writer stayed stopped gained a thread and a
    descriptor per request. A process now keeps at most one such waiter per lease directory,
    taken back by the next wait of any of its handles; it ends once the holder lets go."""
    path, holder = stopped_hermes_writer
    before = lease_waiters()
    for n in range(3):
        db = SessionDB(db_path=path)
        try:
            with pytest.raises(WriterBusyError) as busy:
                db.append_message("s1", "user", f"request {n}")
            assert busy.value.pid == holder.pid
        finally:
            db.close()
    assert lease_waiters() - before == 1
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 30
    while lease_waiters() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lease_waiters() == before  # given the lock once nobody wants it, it let go and ended
    assert isinstance(append_in_new_handle(path), int)  # and nothing keeps the lease
