"""LMDB-specific promises: persistence, map growth, bounded reads, fork safety, offline tampering."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

import eventlog.log.lmdb as logmod
from eventlog import profiles
from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    ForkedEnvironmentError,
    ProfileNameError,
    StorageError,
    ValidationError,
)
from eventlog.log.lmdb import EventLog


def ev(session: str = "s1", **data: object) -> dict[str, object]:
    return {"type": "test.happened", "session": session, "data": data}


def fill(path: Path, n: int, **extra: object) -> list[dict[str, object]]:
    with EventLog.open(path, durability="nosync") as lg:
        lg.append([ev(i=i, marker=f"MARK{i:04d}", **extra) for i in range(n)])
        return list(lg.read())




def test_hash_at_checks_its_argument_and_finds_nothing_below_one(tmp_path: Path) -> None:
    """``hash_at`` (read by the projections' cursor checks) takes a seq like ``get``: a string
    or a float was an AttributeError, a negative seq an OverflowError."""
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([ev()])
        assert lg.hash_at(1) == lg.head()[1]
        assert lg.hash_at(0) is None and lg.hash_at(-1) is None and lg.hash_at(2) is None
        for bad in ("1", None, 1.0, 2**64):
            with pytest.raises(ValidationError) as info:
                lg.hash_at(bad)  # type: ignore[arg-type]
            assert info.value.field == "seq"


def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        EventLog.open(tmp_path / "log", durability="fast")


def test_map_full_grows_the_map_and_retries_the_whole_batch(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", map_size=256 * 1024, durability="nosync") as lg:
        seqs: list[int] = []
        for b in range(20):
            seqs += lg.append([ev(i=i, pad=os.urandom(1000).hex()) for i in range(25)])  # incompressible
        assert seqs == list(range(1, 501))
        assert lg._env.info()["map_size"] > 256 * 1024
        assert lg.verify().ok


def test_long_scan_holds_no_read_transaction_between_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logmod, "READ_CHUNK", 10)
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([ev(i=i) for i in range(55)])
        it = lg.read()
        for _ in range(15):
            next(it)
        assert lg._readers == 0, "a paused scan must not pin a read transaction"
        assert [e["seq"] for e in it][-1] == 55
        sess = lg.read_session("s1")
        next(sess)
        assert lg._readers == 0
        assert len(list(sess)) == 54


def test_reader_check_runs_on_open(tmp_path: Path) -> None:
    fill(tmp_path / "log", 3)
    with EventLog.open(tmp_path / "log") as lg:
        assert lg.reader_check() == 0


def test_use_after_fork_is_a_clear_error(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as lg:
        lg.append([ev(n=1)])
        pid = os.fork()
        if pid == 0:  # child
            code = 3
            try:
                lg.append([ev(n=2)])
            except ForkedEnvironmentError:
                code = 0
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert lg.append([ev(n=3)]) == [2]


def _in_child(fn: Any) -> int:
    """Run ``fn`` in a forked child; its return value is the child's exit status."""
    pid = os.fork()
    if pid == 0:
        code = 4
        try:
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status)


def test_opening_again_in_a_forked_child_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    """py-lmdb cannot open an environment again in a child that inherited it open: the child's
    open says so (ForkedEnvironmentError, with what to do), rather than a generic failure, and
    a store opened in the child fails at open, not at its first write."""
    from eventlog import SessionStore

    with EventLog.open(tmp_path / "log") as lg:
        lg.append([ev(n=1)])

        def reopen_log() -> int:
            try:
                EventLog.open(tmp_path / "log")
            except ForkedEnvironmentError as e:
                return 0 if "spawn" in (e.hint or "") and str(tmp_path / "log") in e.message else 5
            return 3

        assert _in_child(reopen_log) == 0
        assert lg.append([ev(n=2)]) == [2]
        assert lg.head()[0] == 2

    with SessionStore.open(tmp_path, "p") as store:
        sid = store.create_session(source="cli")

        def reopen_store() -> int:
            try:
                SessionStore.open(tmp_path, "p")
            except ForkedEnvironmentError:
                return 0
            return 3

        assert _in_child(reopen_store) == 0
        store.append_message(sid, "user", "parent")
        assert [m["content"] for m in store.get_messages(sid)] == ["parent"]


def test_a_child_forked_after_the_stores_closed_opens_its_own(tmp_path: Path) -> None:
    from eventlog import SessionStore

    with SessionStore.open(tmp_path, "p") as store:
        sid = store.create_session(source="cli")

    def write() -> int:
        with SessionStore.open(tmp_path, "p") as child:
            child.append_message(sid, "user", "from the child")
        return 0

    assert _in_child(write) == 0
    with SessionStore.open(tmp_path, "p") as store:
        assert [m["content"] for m in store.get_messages(sid)] == ["from the child"]


def test_generated_ids_of_a_forked_child_do_not_collide_with_the_parent() -> None:
    # A forked child inherits the id counter; its salt is re-rolled at fork, so two processes
    # generating ids in the same nanosecond with the same counter still differ.
    from eventlog.log import codec

    parent = codec.new_id(now_ns=1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.write(w, codec.new_id(now_ns=1).encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert len(child) == len(parent) == 32
    assert child[-10:] != parent[-10:], "the child kept the parent's id salt"
    assert child != codec.new_id(now_ns=1)




def test_unwritable_directory_gives_a_hint(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores permission bits; use a path under a regular file instead
        (tmp_path / "file").write_text("x")
        with pytest.raises(StorageError) as info:
            EventLog.open(tmp_path / "file" / "log")
        assert info.value.message
        return
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    with pytest.raises(StorageError):
        EventLog.open(d / "log")


def test_files_and_dirs_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.umask(0o022)
    try:
        d = profiles.profile_dir(tmp_path / "h", "p1")
        with EventLog.open(d / "log") as lg:
            lg.append([ev(n=1)])
    finally:
        os.umask(old)
    for p in [tmp_path / "h", tmp_path / "h" / "profiles", d, d / "log"]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    for f in (d / "log").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "", "x" * 65, "nul\x00", ".", "..", "-lead", "new\nline", "a b", 7])
def test_hostile_profile_names_are_refused_before_touching_disk(tmp_path: Path, name: object) -> None:
    with pytest.raises(ProfileNameError):
        profiles.profile_dir(tmp_path / "h", name)  # type: ignore[arg-type]
    assert not (tmp_path / "h").exists()


def test_good_profile_names(tmp_path: Path) -> None:
    for name in ["default", "a", "A.b-c_9", "x" * 64]:
        assert profiles.profile_dir(tmp_path / "h", name).is_dir()

















def test_one_write_group_sees_what_its_earlier_requests_write(tmp_path: Path) -> None:
    """A write group puts its rows into the tables only at its end (one putmulti per table), so
    each request must still see the requests before it in the same group: a repeated caller id
    is a replay (same content: the first one's seq) or a duplicate, and an expected version
    counts the events the group already gives the stream."""
    from eventlog.log.base import prepare_batch
    from eventlog.log.lmdb import _Request

    with EventLog.open(tmp_path / "log") as lg:
        core = lg._core

        def req(events: list[dict[str, Any]], expected: int | None = None) -> _Request:
            items = prepare_batch(events, expected)
            payloads = [core.compression.compress(it.data_bytes) for it in items] if core.format == 2 else None
            return _Request(items, payloads, expected)

        def ev(eid: str, text: str, session: str = "s") -> dict[str, Any]:
            return {"type": "test.said", "session": session, "id": eid, "data": {"text": text}}

        group = [req([ev("a", "one")], 0), req([ev("a", "one")]), req([ev("b", "two")], 1),
                 req([ev("a", "other")]), req([ev("c", "three")], 1)]
        core._commit_group(group)
        assert [r.seqs for r in group[:3]] == [[1], [1], [2]]
        assert isinstance(group[3].error, DuplicateEventError)
        assert isinstance(group[4].error, ConcurrencyError) and group[4].error.actual == 2
        assert [e["id"] for e in lg.read()] == ["a", "b"] and lg.stream_version("s") == 2
        assert lg.verify().ok


@pytest.mark.parametrize("kwargs, field", [
    ({"path": ""}, "path"), ({"path": "   "}, "path"), ({"path": 5}, "path"), ({"path": b"/tmp/x"}, "path"),
    ({"path": "a\0b"}, "path"), ({"map_size": -1}, "map_size"), ({"map_size": 2**64}, "map_size"),
    ({"map_size": "big"}, "map_size"), ({"max_readers": 0}, "max_readers"), ({"lock_timeout": -1}, "lock_timeout"),
])
def test_bad_open_arguments_are_validation_errors_and_create_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     kwargs: dict[str, Any], field: str) -> None:
    """EventLog.open("") turned the working directory into a log, and a non-path or a negative
    map size raised TypeError/OverflowError (found by an outside audit)."""
    from eventlog.errors import ValidationError

    monkeypatch.chdir(tmp_path)
    args = {"path": tmp_path / "log", **kwargs}
    with pytest.raises(ValidationError) as info:
        EventLog.open(args.pop("path"), **args)
    assert info.value.field == field
    assert os.listdir(tmp_path) == []


def test_an_append_conditional_on_the_head_writes_nothing_when_the_log_moved(tmp_path: Path) -> None:
    """``expected_head`` (the Hermes facade's guard): checked inside the write transaction, and
    within a group of concurrent appends against the events of the requests before it."""
    import threading

    from eventlog.errors import HeadMovedError

    with EventLog.open(tmp_path / "log") as lg:
        lg.append([ev(i=0), ev(i=1)])
        with pytest.raises(HeadMovedError) as e:
            lg.append([ev(i=2)], expected_head=1)
        assert (e.value.expected, e.value.actual) == (1, 2) and isinstance(e.value, ConcurrencyError)
        assert lg.head()[0] == 2
        assert lg.append([ev(i=2)], expected_head=2) == [3]
        # Eight threads, each appending at the head it read: exactly one wins per head, the
        # others are refused having written nothing, whatever the group commits look like.
        won: list[int] = []
        refused = 0
        mu = threading.Lock()
        start = threading.Barrier(8)

        def race(k: int) -> None:
            nonlocal refused
            start.wait()
            for _ in range(20):
                at = lg.head()[0]
                try:
                    seqs = lg.append([ev(k=k, at=at)], expected_head=at)
                except HeadMovedError:
                    with mu:
                        refused += 1
                    continue
                assert seqs == [at + 1]
                with mu:
                    won.append(at)

        threads = [threading.Thread(target=race, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == len(set(won)) and len(won) + refused == 160
        assert lg.head()[0] == 3 + len(won)
        assert all(e["data"]["at"] == e["seq"] - 1 for e in lg.read(4))
        assert lg.verify().ok
