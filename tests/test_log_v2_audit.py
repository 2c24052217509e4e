"""Storage v2 from outside (helper-54's audit): a handle that has written keeps writing into the
log's current generation after another process compacted it, whatever the write."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from eventlog.log.lmdb import EventLog


def ev(i: int) -> dict[str, object]:
    return {"type": "test.happened", "session": "s1", "data": {"i": i}}


OTHER = textwrap.dedent("""
    import sys
    from eventlog.log.lmdb import EventLog
    with EventLog.open(sys.argv[1]) as lg:
        lg.compact()
        lg.append([{"type": "test.happened", "session": "s1", "data": {"i": 100 + i}} for i in range(3)])
""")


WRITES: dict[str, Callable[[EventLog], object]] = {
    "compact": lambda lg: lg.compact(),
    "erase": lambda lg: lg.erase([2], {"reason": "test"}),
    "append": lambda lg: lg.append([ev(50)]),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_after_another_process_compacted_lands_in_the_new_generation(tmp_path: Path, write: str) -> None:
    # A handle whose environment had been made writable went on writing into the generation
    # another process's compaction had retired: its own compaction copied that stale file and
    # switched every process to it (the other process's three acknowledged events were gone),
    # and its erase was acknowledged into a deleted file.
    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        lg.append([ev(i) for i in range(5)])
        subprocess.run([sys.executable, "-c", OTHER, str(p)], check=True, timeout=60)
        WRITES[write](lg)
    with EventLog.open(p) as lg:
        assert lg.verify().ok
        datas = [e.get("data", {}).get("i") for e in lg.read()]
    assert [100, 101, 102] == [i for i in datas if i in (100, 101, 102)]
    if write == "erase":
        with EventLog.open(p) as lg:
            assert lg.get(2) is not None and lg.get(2).get("erased") and lg.head()[0] == 9


DATA = Path(__file__).parent / "data"


def test_an_append_prepared_on_a_first_format_log_migrated_meanwhile_is_stored_in_format_2(tmp_path: Path) -> None:
    # A handle that had the first-format log open appended, after another process's compaction
    # migrated it, its events as first-format values into the format-2 log: readable, but no
    # later compaction re-encodes them (the migration is over).
    import tarfile

    import lmdb

    from eventlog.log import stored

    with tarfile.open(DATA / "format1-log.tgz") as tar:
        tar.extractall(tmp_path)
    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        assert lg._core.format == stored.FORMAT_1
        lg.append([ev(1)])
        subprocess.run([sys.executable, "-c", "import sys\nfrom eventlog.log.lmdb import EventLog\n"
                        "with EventLog.open(sys.argv[1]) as lg: lg.compact()", str(p)], check=True, timeout=60)
        seq = lg.append([{"type": "test.happened", "session": "s1", "data": {"text": "after the migration " * 20}}])[0]
        assert lg._core.format == stored.FORMAT_2 and lg.verify().ok
    env = lmdb.open(str(p / "current"), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:
        value = bytes(txn.get(seq.to_bytes(8, "big"), db=env.open_db(b"events", txn=txn)))
    env.close()
    assert value[0] == stored.KIND_EVENT


KILLED_COMPACTION = textwrap.dedent("""
    import os, signal, sys
    import eventlog.log.lmdb as m
    stage = sys.argv[2]
    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)
    if stage == "copied":  # the copy made, not verified yet
        m.verify_environment = die
    elif stage == "renamed":  # g<N> in place, ``current`` not switched yet
        m.fsync_dir = die
    elif stage == "linking":  # ``current.tmp`` made, not renamed over ``current``
        m.os.replace = die
    else:  # ``current`` switched, the previous files not retired yet
        m._Environment._retire = die
    with m.EventLog.open(sys.argv[1]) as lg:
        lg.compact()
""")


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("stage", ["copied", "renamed", "linking", "switched"])
def test_a_first_write_removes_what_a_killed_compaction_left(tmp_path: Path, stage: str, compacted: bool) -> None:
    # A compaction SIGKILLed part-way left a whole copy of the log behind (g<N>.tmp, a g<N> that
    # ``current`` does not name, or the first layout's data.mdb beside ``current``) until the next
    # compaction — which may never come; a first-layout data.mdb left there is also where a process
    # of the first release would go on writing, acknowledged and lost.
    import os

    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        lg.append([ev(i) for i in range(50)])
        if compacted:
            lg.compact()
    child = subprocess.run([sys.executable, "-c", KILLED_COMPACTION, str(p), stage], timeout=60)
    assert child.returncode == -9
    with EventLog.open(p) as lg:
        assert lg.head()[0] == 50
        lg.append([ev(50)])
        assert lg.verify().ok and lg.head()[0] == 51
        live = lg._core.env_dir.name
    names = sorted(n for n in os.listdir(p) if n not in ("writer.lock", "dictionaries.lock"))
    if live == "log":  # never compacted: the first layout
        assert names == ["data.mdb", "lock.mdb"]
    else:
        assert names == sorted(["current", live] + (["data.mdb", "lock.mdb"] if (p / "data.mdb").is_symlink() else []))
        assert not any((p / n).is_file() and not (p / n).is_symlink() for n in ("data.mdb", "lock.mdb"))


GROW = textwrap.dedent("""
    import os, sys
    from eventlog.log.lmdb import EventLog
    with EventLog.open(sys.argv[1], map_size=int(sys.argv[2])) as lg:
        for i in range(60):
            lg.append([{"type": "test.happened", "session": "w", "data": {"t": os.urandom(4000).hex()}}])
""")


SEALED = textwrap.dedent("""
    import sys
    from eventlog.log.lmdb import EventLog
    with EventLog.open(sys.argv[1]) as source, EventLog.open(sys.argv[2], map_size=int(sys.argv[3])) as target:
        target.append_sealed([raw for _, raw in source.read(2, 60, raw=True)])
""")


@pytest.mark.parametrize("write", ["erase", "compact", "import"])
def test_a_write_after_another_process_grew_the_map_picks_up_its_size(tmp_path: Path, write: str) -> None:
    # Another process grew the map past the size this handle opened with: an erase raised
    # py-lmdb's own MapResizedError (untyped), an import failed with a StorageError, and a
    # compaction that had switched every process to its copy raised one when it reopened on it.
    p = tmp_path / "log"
    small = 128 * 1024
    with EventLog.open(p, map_size=small) as lg:
        seq = lg.append([ev(1)])[0]
        if write == "import":
            with EventLog.open(tmp_path / "copy", map_size=small) as copy:
                copy.append_sealed([raw for _, raw in lg.read(1, 1, raw=True)])
                subprocess.run([sys.executable, "-c", GROW, str(p), str(small)], check=True, timeout=60)
                subprocess.run([sys.executable, "-c", SEALED, str(p), str(tmp_path / "copy"), str(small)],
                               check=True, timeout=60)
                assert copy.append_sealed([raw for _, raw in lg.read(61, 61, raw=True)]) == 1
                assert copy.verify().ok and copy.head() == lg.head()
            return
        subprocess.run([sys.executable, "-c", GROW, str(p), str(small)], check=True, timeout=60)
        if write == "erase":
            assert lg.erase([seq], {"reason": "test"}, compact=False) == 62
        else:
            lg.compact()
            assert lg.head()[0] == 61
        assert lg.verify().ok


def test_a_compaction_on_a_full_disk_is_a_disk_full_error_that_leaves_nothing_behind(tmp_path: Path) -> None:
    # It raised py-lmdb's own "mdb_txn_commit: Input/output error" (untyped; the CLI printed it
    # without a hint) and left its partial copy in log/g1.tmp, holding what room was left.
    import os

    from eventlog.errors import DiskFullError
    from tests.fixtures_fs import tmpfs

    with tmpfs(tmp_path / "fs", "8m") as fs:
        p = fs / "log"
        with EventLog.open(p) as lg:
            for b in range(20):
                lg.append([{"type": "test.happened", "session": "s1", "data": {"t": os.urandom(1500).hex()}}
                           for _ in range(50)])
            free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
            with open(fs / "filler", "wb") as f:
                f.write(b"\0" * max(0, free - 300 * 1024))
            head = lg.head()
            with pytest.raises(DiskFullError):
                lg.compact()
            assert sorted(os.listdir(p)) == ["data.mdb", "dictionaries.lock", "lock.mdb", "writer.lock"]
            assert lg.head() == head and lg.verify().ok
            os.unlink(fs / "filler")
            assert lg.compact()["generation"] == "g1" and lg.head() == head


def test_pages_are_never_released_from_a_mapping_a_close_is_removing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A long scan hands its pages back (madvise) between read transactions, outside the count of
    # readers a close waits for: a close of the last handle in another thread could unmap the
    # file between the scan finding its address range and the madvise, and a range reused
    # meanwhile (a malloc arena) would have been zeroed.
    import threading

    from eventlog.log import residency

    p = tmp_path / "log"
    lg = EventLog.open(p)
    lg.append([ev(i) for i in range(10)])
    core = lg._core
    seen: list[list[tuple[int, int]]] = []
    real = residency.mappings

    closer = threading.Thread(target=lg.close)

    def mappings_then_close(path: str) -> list[tuple[int, int]]:
        found = real(path)
        closer.start()
        closer.join(0.3)
        seen.append(real(path))  # the mapping must still be there for the madvise that follows
        return found

    monkeypatch.setattr(residency, "mappings", mappings_then_close)
    core.release_pages()
    closer.join(10)
    assert len(seen) == 1 and seen[0] and core._closed and not real(str(core.env_dir / "data.mdb"))


LIMITED = textwrap.dedent("""
    import os, resource, sys
    from eventlog.errors import DiskFullError
    from eventlog.log.lmdb import EventLog
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))
    with EventLog.open(sys.argv[1]) as lg:
        big = {"type": "test.happened", "session": "s1", "data": {"t": os.urandom(200_000).hex()}}
        for write in (lambda: lg.append([big]), lg.compact):
            try:
                write()
            except DiskFullError as e:
                print("DiskFullError", "ulimit -f" in e.hint)
""")


def test_a_file_size_limit_is_room_for_the_log_too(tmp_path: Path) -> None:
    # An append or a compaction past `ulimit -f` failed with "mdb_txn_commit: File too large" (or
    # "Input/output error") and the generic hint to check the disk and permissions.
    import os

    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        for _ in range(30):
            lg.append([{"type": "test.happened", "session": "s1", "data": {"t": os.urandom(20_000).hex()}}])
    out = subprocess.run([sys.executable, "-c", LIMITED, str(p)], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["DiskFullError True", "DiskFullError True"], out.stdout + out.stderr
    assert sorted(os.listdir(p)) == ["data.mdb", "dictionaries.lock", "lock.mdb", "writer.lock"]


HALF_MADE = textwrap.dedent("""
    import fcntl, os, struct, sys, time
    # What a first opener SIGKILLed while making LMDB's lock table leaves for the processes that
    # were opening at that moment: a table of zeros, and their shared locks on it (LMDB's own
    # open-time lock, byte 0) -- those opens fail, and let go.
    fd = os.open(sys.argv[1], os.O_RDWR)
    os.pwrite(fd, b"\\0" * 8192, 0)
    fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 1, 0))
    print("ready", flush=True)
    time.sleep(float(sys.argv[2]))
""")


@pytest.mark.parametrize("where", ["open", "reopen"])
def test_a_lock_table_whose_maker_was_killed_is_made_again(tmp_path: Path, where: str) -> None:
    # An open meeting that state failed once, as LMDB's MDB_INVALID: a fresh open said another
    # process had the lock table open and it was damaged, and a handle following a compaction
    # to the new generation (whose first opener had been killed) failed its read or append with
    # "not a valid LMDB environment ... restore the profile's log/ from a backup" (outside audit,
    # helper-54, in a SIGKILL campaign). Such a table is made again by the next open that has it
    # alone: the open retries.
    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        lg.append([ev(1)])
        lg.compact()
    lg = EventLog.open(p) if where == "reopen" else None
    try:
        if lg is not None:
            assert lg.head()[0] == 1
            subprocess.run([sys.executable, "-c", OTHER, str(p)], check=True, timeout=60)  # compact, append 3
        holder = subprocess.Popen([sys.executable, "-c", HALF_MADE, str(p / "current" / "lock.mdb"), "0.3"],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        if lg is None:
            lg = EventLog.open(p)
        assert lg.head()[0] == (4 if where == "reopen" else 1)
        assert lg.append([ev(2)]) and lg.verify().ok
        holder.wait(10)
    finally:
        if lg is not None:
            lg.close()


def test_a_reopen_racing_the_removal_of_the_generation_it_read_never_serves_an_empty_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A handle whose environment is writable reopens at a read when the log moved; when another
    # process's compaction removed the folder ``current`` had named between the handle reading
    # the link and LMDB opening it (the folder emptied, not yet gone), LMDB made a new, empty
    # data file there, the reopen created the tables in it, and the read answered from an empty
    # log: head() said 0 (found by reading the reopen path, helper-54).
    import eventlog.log.lmdb as lmdb_log

    p = tmp_path / "log"
    with EventLog.open(p) as first:
        first.append([ev(0)])
        first.compact()
    lg = EventLog.open(p)
    try:
        lg.append([ev(1)])  # writable now, on g1
        subprocess.run([sys.executable, "-c", OTHER, str(p)], check=True, timeout=60)  # g2, +3 events
        (p / "g1").mkdir()  # the retired folder, emptied but not removed yet
        real, armed = lmdb_log.generation_dir, {"left": 1}

        def stale_once(log_dir: Path) -> Path:
            if armed["left"] and sys._getframe(1).f_code.co_name == "_open_current":
                armed["left"] -= 1
                return log_dir / "g1"
            return real(log_dir)

        monkeypatch.setattr(lmdb_log, "generation_dir", stale_once)
        assert lg.head()[0] == 5
        assert lg.verify().ok
    finally:
        lg.close()


def test_a_log_whose_directory_was_removed_says_so_at_every_call(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The whole log directory removed under an open handle: every call is a StorageError saying
    the log is gone. Each call warned 'lock.mdb was deleted or replaced; reopening', failed to
    open, and the calls after it met a closed environment ('Attempt to operate on closed/deleted/
    dropped object') (outside audit, helper-54)."""
    import shutil

    from eventlog.errors import StorageError

    lg = EventLog.open(tmp_path / "p" / "log")
    try:
        lg.append([{"type": "test.happened", "data": {"n": 1}}])
        shutil.rmtree(tmp_path / "p")
        with caplog.at_level("WARNING", logger="eventlog.log"):
            for _ in range(2):
                with pytest.raises(StorageError, match="is gone: its directory was removed"):
                    lg.append([{"type": "test.happened", "data": {"n": 2}}])
                with pytest.raises(StorageError, match="is gone: its directory was removed"):
                    lg.head()
        assert "reopening" not in caplog.text
    finally:
        lg.close()
