"""The log contract as tests: what every backend of :class:`eventlog.log.Log` must pass.

A backend adopts it with one small test module::

    from eventlog.log.contract import GroupCommitContract, LogContract

    class TestMyLog(LogContract, GroupCommitContract):
        def make_log(self, tmp_path):          # a new, empty log
            return MyLog.open(tmp_path / "log")

        def reopen(self, log):                 # close it, open the same stored events again
            log.close()
            return MyLog.open(log.path)

        def tamper(self, log, edit):           # close it, let edit() change the stored bytes
            ...                                # ({seq: bytes}; a deleted key removes the event),
            return MyLog.open(log.path)        # write them back bypassing the chain, reopen

:class:`LogContract` covers append/read round trips, gapless seqs, the chain, idempotent ids
(also across reopen), ``expected_version``, error isolation between concurrent callers,
``append_sealed``, ``event_seq``, refusal after close, tamper detection (flip, remove, swap,
forge, reformat) and ``follow``. :class:`GroupCommitContract` adds that concurrent callers
share write transactions (the backend counts them in ``commits``). Needs pytest and
hypothesis (the ``test`` extra).
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.errors import (
    ClosedError,
    ConcurrencyError,
    DuplicateEventError,
    EventTooLargeError,
    IntegrityError,
    ValidationError,
)
from eventlog.log import codec
from eventlog.log.base import Log

Edit = Callable[[dict[int, bytes]], None]


def ev(session: str | None = "s1", **data: Any) -> dict[str, Any]:
    """A test event of type ``test.happened`` in ``session`` carrying ``data``."""
    return {"type": "test.happened", "session": session, "data": data}


def stored(lg: Log) -> list[bytes]:
    """Every stored event's bytes, in seq order."""
    return [bytes(v) for _, v in lg.read(raw=True)]


BAD_EVENTS: list[tuple[str, Any]] = [
    ("events[1]", "not an object"),
    ("events[1].data", {"type": "a.b", "session": "s", "data": [1, 2]}),
    ("events[1].data", {"type": "a.b", "session": "s"}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": float("nan")}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": float("inf")}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": "bad \ud800 surrogate"}}),
    ("events[1].data", {"type": "a.b", "session": "s", "data": {"key \udfff": 1}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": b"bytes"}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": 2**70}}),
    # orjson writes and reads back 64-bit unsigned ints: the import of their export refused them
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": 2**63}}),
    ("events[1].data.x[1].y", {"type": "a.b", "session": "s", "data": {"x": [1, {"y": 2**64 - 1}]}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": -(2**63) - 1}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": {1, 2}}}),
    ("events[1].extra", {"type": "a.b", "session": "s", "data": {}, "extra": 1}),
    ("events[1].type", {"type": "NotDotted", "session": "s", "data": {}}),
    ("events[1].type", {"session": "s", "data": {}}),
    ("events[1].type", {"type": ["a.b"], "session": "s", "data": {}}),  # unhashable: no cache lookup may raise
    ("events[1].type", {"type": {"a": "b"}, "session": "s", "data": {}}),
    ("events[1].type", {"type": type("Str", (str,), {})("a.b"), "session": "s", "data": {}}),
    ("events[1].session", {"type": "a.b", "session": ["s"], "data": {}}),
    ("events[1].id", {"type": "a.b", "session": "s", "data": {}, "id": ["x"]}),
    ("events[1].v", {"type": "a.b", "session": "s", "data": {}, "v": [1]}),
    ("events[1].session", {"type": "a.b", "session": "../etc", "data": {}}),
    ("events[1].session", {"type": "a.b", "session": 5, "data": {}}),
    ("events[1].id", {"type": "a.b", "session": "s", "data": {}, "id": ""}),
    ("events[1].v", {"type": "a.b", "session": "s", "data": {}, "v": True}),
]

def sealed_chain(envs: list[dict[str, Any]], prev: str = codec.ZERO_HASH, first: int = 1) -> list[bytes]:
    """Canonical bytes of the envelopes ``envs`` chained from seq ``first`` after ``prev`` (seq,
    prev and hash filled in; each id gets ``-<seq>``): what a crafted whole-chain import holds."""
    out = []
    for seq, env in enumerate(envs, first):
        body = dict(env, id=f"{env['id']}-{seq}" if isinstance(env.get("id"), str) else env.get("id"), seq=seq,
                    prev=prev)
        digest = hashlib.sha256(bytes.fromhex(prev) + codec.canonical(body)).hexdigest()
        out.append(codec.canonical(dict(body, hash=digest)))
        prev = digest
    return out


ODD_ENVELOPES = [  # each hash-valid; none fits the format-2 header as it is
    {"type": "session.created", "v": 1, "session": "s1", "id": "e1", "ts": -1, "data": {"source": "cli"}},
    {"type": "message.appended", "v": 70000, "session": "s1", "id": "e2", "ts": 5, "data": {"role": "user", "content": "v"}},
    {"type": "message.appended", "v": 1, "session": "s1", "id": "e3", "ts": 6, "origin": "elsewhere",
     "data": {"role": "user", "content": "extra key"}},
    {"type": "message.appended", "v": 1, "session": "s1", "id": "e4", "ts": 7.5, "data": {"role": "user", "content": "f"}},
    {"type": "message.appended", "v": 1, "session": "s1", "id": "e5", "ts": 8, "data": {"role": "user", "content": "plain"}},
    {"type": "mess\u00e4ge.appended", "v": 1, "session": None, "id": "e6", "ts": 9, "data": {}},
]

UNUSABLE_ENVELOPES: list[tuple[str, dict[str, Any]]] = [  # hash-valid, but no reader or index could use them
    ("type", {"type": 5, "v": 1, "session": "s1", "id": "e", "ts": 1, "data": {}}),
    ("type", {"type": None, "v": 1, "session": "s1", "id": "e", "ts": 1, "data": {}}),
    ("type", {"type": "", "v": 1, "session": "s1", "id": "e", "ts": 1, "data": {}}),
    ("session", {"type": "a.b", "v": 1, "session": ["s1"], "id": "e", "ts": 1, "data": {}}),
    ("session", {"type": "a.b", "v": 1, "session": "", "id": "e", "ts": 1, "data": {}}),
    ("session", {"type": "a.b", "v": 1, "session": "s" * 600, "id": "e", "ts": 1, "data": {}}),
    ("session", {"type": "a.b", "v": 1, "session": 7, "id": "e", "ts": 1, "data": {}}),
    ("id", {"type": "a.b", "v": 1, "session": "s1", "id": 12, "ts": 1, "data": {}}),
    ("id", {"type": "a.b", "v": 1, "session": "s1", "id": "e" * 600, "ts": 1, "data": {}}),
    ("data", {"type": "a.b", "v": 1, "session": "s1", "id": "e", "ts": 1, "data": [1]}),
    ("data", {"type": "a.b", "v": 1, "session": "s1", "id": "e", "ts": 1}),
]

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(codec.INT64_MIN, codec.INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


class LogContract:
    """Tests every :class:`~eventlog.log.Log` backend passes. Subclass it as ``Test<Backend>``
    and provide :meth:`make_log`, :meth:`reopen` and :meth:`tamper`."""

    # ---- hooks -----------------------------------------------------------------------------

    # Each backend's test class provides them:
    make_log: Callable[[Path], Log]
    """A new, empty log whose storage lives under ``tmp_path``."""
    reopen: Callable[[Log], Log]
    """Close ``log`` and return a new handle on the same stored events."""
    tamper: Callable[[Log, Edit], Log]
    """Close ``log``; call ``edit`` with ``{seq: stored bytes}`` of every event; write the changes
    back at the storage level, bypassing the chain (a missing key deletes that event); return a
    reopened handle."""

    # ---- fixtures --------------------------------------------------------------------------

    @pytest.fixture
    def log(self, tmp_path: Path) -> Iterator[Log]:
        self._handles: list[Log] = [self.make_log(tmp_path)]
        yield self._handles[0]
        for h in self._handles:
            h.close()

    def _reopen(self, log: Log) -> Log:
        lg = self.reopen(log)
        self._handles.append(lg)
        return lg

    def _tamper(self, log: Log, edit: Edit) -> Log:
        lg = self.tamper(log, edit)
        self._handles.append(lg)
        return lg

    # ---- append and read -------------------------------------------------------------------

    def test_empty_log_head_is_zero(self, log: Log) -> None:
        assert log.head() == (0, "0" * 64)
        assert list(log.read()) == []
        assert log.verify().ok

    def test_seqs_are_gapless_from_one_and_chained(self, log: Log) -> None:
        assert log.append([ev(n=1)]) == [1]
        assert log.append([ev(n=2), ev(n=3)]) == [2, 3]
        envs = list(log.read())
        assert [e["seq"] for e in envs] == [1, 2, 3]
        assert envs[0]["prev"] == "0" * 64
        assert envs[1]["prev"] == envs[0]["hash"] and envs[2]["prev"] == envs[1]["hash"]
        assert log.head() == (3, envs[2]["hash"])
        assert all(isinstance(e["ts"], int) and e["ts"] > 1_600_000_000 * 10**9 for e in envs)

    def test_envelope_shape(self, log: Log) -> None:
        log.append([{"type": "a.b", "session": "s", "data": {"x": [1, "two", None]}, "id": "my-id", "v": 3}])
        env = log.get(1)
        assert env is not None
        assert set(env) == {"seq", "id", "ts", "type", "v", "session", "data", "prev", "hash"}
        assert (env["id"], env["type"], env["v"], env["session"], env["data"]) == ("my-id", "a.b", 3, "s",
                                                                                   {"x": [1, "two", None]})

    def test_hash_is_sha256_of_prev_and_canonical_bytes(self, log: Log) -> None:
        log.append([ev(text="héllo ☃")])
        env = log.get(1)
        assert env is not None
        body = {k: v for k, v in env.items() if k != "hash"}
        expect = hashlib.sha256(bytes.fromhex(env["prev"]) + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
        assert env["hash"] == expect

    def test_an_empty_batch_appends_nothing(self, log: Log) -> None:
        assert log.append([]) == []
        assert log.head()[0] == 0

    @pytest.mark.parametrize("field,bad", BAD_EVENTS)
    def test_bad_input_is_refused_naming_the_field_and_appends_nothing(self, log: Log, field: str, bad: Any) -> None:
        log.append([ev(n=0)])
        before = (log.head(), stored(log))
        with pytest.raises(ValidationError) as info:
            log.append([ev(n=1), bad])
        assert info.value.field.startswith(field), info.value.field
        assert (log.head(), stored(log)) == before

    def test_a_batch_that_is_not_a_list_is_refused(self, log: Log) -> None:
        for bad in ("text", ev(n=1), 7):
            with pytest.raises(ValidationError) as info:
                log.append(bad)  # type: ignore[arg-type]
            assert info.value.field == "events"
        assert log.head()[0] == 0

    def test_event_over_size_limit_is_refused(self, log: Log) -> None:
        with pytest.raises(EventTooLargeError) as info:
            log.append([ev(blob="x" * codec.MAX_EVENT_BYTES)])
        assert info.value.field == "events[0].data"
        assert log.head()[0] == 0

    def test_deep_nesting_is_refused(self, log: Log) -> None:
        deep: Any = "leaf"
        for _ in range(100):
            deep = {"d": deep}
        with pytest.raises(ValidationError):
            log.append([ev(x=deep)])
        assert log.head()[0] == 0

    def test_read_ranges_and_sessions(self, log: Log) -> None:
        for i in range(10):
            log.append([ev("even" if i % 2 == 0 else "odd", i=i)])
        assert [e["seq"] for e in log.read(4, 7)] == [4, 5, 6, 7]
        assert [e["seq"] for e in log.read(9)] == [9, 10]
        assert [s for s, _ in log.read(2, 3, raw=True)] == [2, 3]
        assert [e["data"]["i"] for e in log.read_session("odd")] == [1, 3, 5, 7, 9]
        assert list(log.read_session("missing")) == []
        assert [e["seq"] for e in log.read_session("odd", after=6)] == [8, 10]
        assert [e["seq"] for e in log.read_session("odd", after=2)] == [4, 6, 8, 10]
        assert list(log.read_session("odd", after=10)) == []
        got = log.get(3)
        assert log.get(11) is None and got is not None and got["data"] == {"i": 2}
        assert log.stream_version("even") == 5 and log.stream_version("missing") == 0

    def test_reads_given_the_wrong_types_are_refused_naming_the_argument(self, log: Log) -> None:
        log.append([ev("s1", i=0)])
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("from_seq", lambda: list(log.read("1"))),  # type: ignore[arg-type]
            ("to_seq", lambda: list(log.read(1, 2.0))),  # type: ignore[arg-type]
            ("from_seq", lambda: next(iter(log.follow("x", timeout=0)))),  # type: ignore[arg-type]
            ("seq", lambda: log.get("1")),  # type: ignore[arg-type]
            ("session_id", lambda: list(log.read_session(5))),  # type: ignore[arg-type]
            ("after", lambda: list(log.read_session("s1", after="1"))),  # type: ignore[arg-type]
            ("session", lambda: log.stream_version(None)),  # type: ignore[arg-type]
            ("event_id", lambda: log.event_seq(5)),  # type: ignore[arg-type]
        ]
        for field, call in calls:
            with pytest.raises(ValidationError) as info:
                call()
            assert info.value.field == field, (field, info.value)
        assert log.head()[0] == 1 and [e["seq"] for e in log.read(1)] == [1]

    def test_lookups_no_event_can_answer_find_nothing(self, log: Log) -> None:
        """A seq below 1, or an id no event can hold (empty, longer than any key), is simply not
        there: it was an OverflowError, or a storage error that read like a disk fault."""
        log.append([dict(ev("s1", i=0), id="e1")])
        for seq in (0, -1, -(2**63)):
            assert log.get(seq) is None
        for name in ("", "s" * 600, "ü" * 300):
            assert log.stream_version(name) == 0 and list(log.read_session(name)) == []
            assert log.event_seq(name) is None
        assert log.stream_version("s1") == 1 and log.event_seq("e1") == 1 and log.get(1) is not None
        assert [e["seq"] for e in log.read_session(session_id="s1")] == [1]  # DESIGN.md names it so

    def test_stored_bytes_are_canonical_and_verify(self, log: Log) -> None:
        log.append([ev(n=i, text="ü" * i) for i in range(5)])
        for raw in stored(log):
            assert codec.canonical(codec.decode(raw)) == raw
        assert log.verify().ok

    # ---- ids and versions ------------------------------------------------------------------

    def test_retry_with_same_ids_returns_original_seqs_and_writes_nothing(self, log: Log) -> None:
        batch = [dict(ev(n=1), id="e-1"), dict(ev(n=2), id="e-2")]
        assert log.append(batch) == [1, 2]
        head = log.head()
        assert log.append(batch) == [1, 2]
        assert log.head() == head

    def test_ids_stay_idempotent_across_reopen(self, log: Log) -> None:
        assert log.append([dict(ev(n=1), id="k1")]) == [1]
        log = self._reopen(log)
        assert log.append([dict(ev(n=1), id="k1")]) == [1]
        assert log.append([ev(n=2)]) == [2]
        assert log.event_seq("k1") == 1
        assert log.verify().ok and log.head()[0] == 2

    def test_a_null_id_is_an_absent_id(self, log: Log) -> None:
        seqs = log.append([dict(ev(n=1), id=None), dict(ev(n=1), id=None)])
        assert seqs == [1, 2]  # two generated, distinct ids: no idempotent replay of each other
        ids = [e["id"] for e in log.read(1)]
        assert all(isinstance(i, str) and i for i in ids) and ids[0] != ids[1]

    def test_a_generated_id_read_back_is_found_and_replays_like_a_callers(self, log: Log) -> None:
        log.append([ev(n=1), ev(n=2), dict(ev(n=3), id="c-3")])
        first, second, third = log.read(1)
        assert (log.event_seq(first["id"]), log.event_seq(second["id"]), log.event_seq("c-3")) == (1, 2, 3)
        head = log.head()
        replay = {k: second[k] for k in ("type", "session", "data", "id")}
        assert log.append([replay]) == [2] and log.head() == head
        with pytest.raises(DuplicateEventError) as info:
            log.append([dict(replay, data={"n": 99})])
        assert info.value.seq == 2 and log.head() == head
        log = self._reopen(log)
        assert log.event_seq(first["id"]) == 1 and log.append([replay]) == [2]
        assert log.append([ev(n=4)]) == [4] and len({e["id"] for e in log.read(1)}) == 4

    def test_partly_replayed_batch_appends_only_new_events(self, log: Log) -> None:
        log.append([dict(ev(n=1), id="e-1")])
        assert log.append([dict(ev(n=2), id="e-2"), dict(ev(n=1), id="e-1")]) == [2, 1]
        assert log.head()[0] == 2

    def test_same_id_with_other_content_is_a_typed_error(self, log: Log) -> None:
        log.append([dict(ev(n=1), id="e-1")])
        before = stored(log)
        with pytest.raises(DuplicateEventError) as info:
            log.append([dict(ev(n=3), id="e-new"), dict(ev(n=2), id="e-1")])
        assert info.value.seq == 1
        assert stored(log) == before

    def test_duplicate_id_inside_one_batch_is_refused(self, log: Log) -> None:
        with pytest.raises(ValidationError):
            log.append([dict(ev(n=1), id="x"), dict(ev(n=2), id="x")])
        assert log.head()[0] == 0

    def test_event_seq_finds_ids(self, log: Log) -> None:
        log.append([dict(ev(n=1), id="a-1"), dict(ev(n=2), id="a-2")])
        assert (log.event_seq("a-2"), log.event_seq("a-1"), log.event_seq("nope")) == (2, 1, None)

    def test_expected_version_guards_a_stream(self, log: Log) -> None:
        log.append([ev("a", n=1), ev("b", n=1)])
        assert log.stream_version("a") == 1
        assert log.append([ev("a", n=2)], expected_version=1) == [3]
        with pytest.raises(ConcurrencyError) as info:
            log.append([ev("a", n=3)], expected_version=1)
        assert (info.value.expected, info.value.actual) == (1, 2)
        assert log.head()[0] == 3
        assert log.append([ev("new", n=1)], expected_version=0) == [4]

    @pytest.mark.parametrize("bad", [-1, "1", 1.0, True])
    def test_expected_version_must_be_a_count(self, log: Log, bad: Any) -> None:
        with pytest.raises(ValidationError) as info:
            log.append([ev("a")], expected_version=bad)
        assert info.value.field == "expected_version" and log.head()[0] == 0

    def test_expected_version_needs_one_stream(self, log: Log) -> None:
        with pytest.raises(ValidationError):
            log.append([ev("a"), ev("b")], expected_version=0)
        with pytest.raises(ValidationError):
            log.append([ev(None)], expected_version=0)

    # ---- concurrency -----------------------------------------------------------------------

    def test_concurrent_threads_get_one_gapless_order(self, log: Log) -> None:
        results: list[list[int]] = []
        lock = threading.Lock()

        def worker(w: int) -> None:
            mine = []
            for i in range(40):
                mine.extend(log.append([ev(f"w{w}", i=i)]))
            with lock:
                results.append(mine)

        ts = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(s for r in results for s in r) == list(range(1, 321))
        for w in range(8):
            assert [e["data"]["i"] for e in log.read_session(f"w{w}")] == list(range(40))
        assert log.verify().ok

    def test_an_error_fails_only_its_own_caller(self, log: Log) -> None:
        log.append([ev("guarded", n=0)])
        errors: list[BaseException] = []
        ok: list[int] = []
        barrier = threading.Barrier(6)

        def good(i: int) -> None:
            barrier.wait()
            ok.extend(log.append([ev("free", i=i)]))

        def bad() -> None:
            barrier.wait()
            try:
                log.append([ev("guarded", n=9)], expected_version=7)
            except ConcurrencyError as e:
                errors.append(e)

        ts = [threading.Thread(target=good, args=(i,)) for i in range(5)] + [threading.Thread(target=bad)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(errors) == 1 and len(ok) == 5
        assert log.stream_version("guarded") == 1 and log.stream_version("free") == 5
        assert log.verify().ok

    # ---- follow ----------------------------------------------------------------------------

    def test_follow_yields_events_as_they_land(self, log: Log) -> None:
        log.append([ev(n=1)])
        got: list[int] = []

        def writer() -> None:
            for i in range(5):
                log.append([ev(n=i + 2)])

        t = threading.Timer(0.05, writer)
        t.start()
        for env in log.follow(1, timeout=2.0):
            got.append(env["seq"])
            if len(got) == 6:
                break
        t.join()
        assert got == [1, 2, 3, 4, 5, 6]

    def test_follow_stops_after_idle_timeout(self, log: Log) -> None:
        log.append([ev(n=1)])
        assert [e["seq"] for e in log.follow(1, timeout=0.1)] == [1]

    def test_follow_ends_when_the_log_closes(self, log: Log) -> None:
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.extend(e["seq"] for e in log.follow(1)))
        t.start()
        log.append([ev(n=1)])
        threading.Event().wait(0.1)
        log.close()
        t.join(5)
        assert not t.is_alive() and seen == [1]

    # ---- sealed imports --------------------------------------------------------------------

    def test_append_sealed_reproduces_another_log(self, log: Log, tmp_path: Path) -> None:
        log.append([dict(ev("a", n=i), id=f"i-{i}") for i in range(5)])
        other = self.make_log(tmp_path / "other")
        self._handles.append(other)
        assert other.append_sealed(stored(log)) == 5
        assert stored(other) == stored(log) and other.head() == log.head() and other.verify().ok
        assert other.event_seq("i-3") == 4 and other.stream_version("a") == 5
        assert other.append([ev("a")]) == [6]

    def test_append_sealed_refuses_what_does_not_continue_the_chain(self, log: Log, tmp_path: Path) -> None:
        log.append([ev(n=i) for i in range(4)])
        raws = stored(log)
        other = self.make_log(tmp_path / "other")
        self._handles.append(other)
        for bad in ([raws[1]], [raws[0], raws[2]], [raws[0], raws[0]], [raws[0][:-2] + b" }"]):
            with pytest.raises(IntegrityError):
                other.append_sealed(bad)
            assert other.head()[0] == 0 and stored(other) == []
        assert other.append_sealed(raws[:2]) == 2
        with pytest.raises(IntegrityError):
            other.append_sealed(raws[:1])  # already there: not a continuation
        assert other.append_sealed(raws[2:]) == 2 and other.verify().ok

    def test_sealed_events_with_odd_envelopes_keep_their_bytes(self, log: Log) -> None:
        """A valid chain whose envelopes a compact stored form cannot hold (an extra key, a
        negative or float ts, a version over 65535, a non-ASCII type) keeps their canonical bytes,
        and so their hashes: dropping the extra key left a log failing its own verify."""
        raws = sealed_chain(ODD_ENVELOPES)
        assert log.append_sealed(raws) == len(raws)
        assert stored(log) == raws and log.verify().ok
        assert log.append([ev("s1")]) == [len(raws) + 1] and log.verify().ok
        assert log.stream_version("s1") == 6

    @pytest.mark.parametrize("field,env", UNUSABLE_ENVELOPES)
    def test_sealed_events_no_reader_could_use_are_refused(self, log: Log, field: str, env: dict[str, Any]) -> None:
        """A hash-valid imported event whose type, session, id or data no reader or index can
        use is an IntegrityError naming the field, and nothing is written (a list session was an
        AttributeError from the stored form, an empty one a storage error from LMDB)."""
        log.append([ev(n=0)])
        before = (log.head(), stored(log))
        good = sealed_chain([{"type": "a.b", "v": 1, "session": "s1", "id": "g", "ts": 1, "data": {}}],
                            before[0][1], 2)
        with pytest.raises(IntegrityError, match=f"its {field} "):
            log.append_sealed(good + sealed_chain([env], codec.decode(good[0])["hash"], 3))
        assert (log.head(), stored(log)) == before
        assert log.append_sealed(good) == 1 and log.verify().ok

    # ---- closed ----------------------------------------------------------------------------

    def test_a_closed_log_refuses_use(self, log: Log) -> None:
        log.append([ev(n=1)])
        log.close()
        log.close()  # idempotent
        for call in (log.head, lambda: log.append([ev(n=2)]), lambda: list(log.read()), log.verify):
            with pytest.raises(ClosedError):
                call()

    # ---- tamper evidence -------------------------------------------------------------------

    def _filled(self, log: Log, n: int) -> list[dict[str, Any]]:
        log.append([ev(i=i, marker=f"MARK{i:04d}") for i in range(n)])
        return list(log.read())

    def test_a_flipped_byte_is_found_at_its_seq(self, log: Log) -> None:
        self._filled(log, 30)

        def flip(events: dict[int, bytes]) -> None:
            raw = bytearray(events[18])
            at = raw.find(b"MARK0017")
            raw[at + 5] ^= 0x01
            events[18] = bytes(raw)

        res = self._tamper(log, flip).verify()
        assert not res.ok and res.first_bad_seq == 18, res

    def test_a_byte_that_breaks_the_json_is_found_at_its_seq(self, log: Log) -> None:
        self._filled(log, 10)

        def garble(events: dict[int, bytes]) -> None:
            events[6] = events[6].replace(b'"data":{', b'"data":[', 1)

        res = self._tamper(log, garble).verify()
        assert not res.ok and res.first_bad_seq == 6, res

    def test_a_removed_event_is_found(self, log: Log) -> None:
        self._filled(log, 20)
        res = self._tamper(log, lambda events: events.__delitem__(7)).verify()
        assert not res.ok and res.first_bad_seq == 7 and "missing" in (res.reason or "")

    def test_a_removed_last_event_is_found(self, log: Log) -> None:
        self._filled(log, 5)
        res = self._tamper(log, lambda events: events.__delitem__(5)).verify()
        assert not res.ok and res.first_bad_seq == 5

    def test_swapped_events_are_found(self, log: Log) -> None:
        self._filled(log, 12)

        def swap(events: dict[int, bytes]) -> None:
            events[4], events[9] = events[9], events[4]

        res = self._tamper(log, swap).verify()
        assert not res.ok and res.first_bad_seq == 4

    def test_a_forged_event_with_its_own_hash_recomputed_is_found_at_the_next(self, log: Log) -> None:
        envs = self._filled(log, 8)

        def forge(events: dict[int, bytes]) -> None:
            old = envs[2]
            prep = codec.prepare({"type": old["type"], "session": old["session"], "data": {"i": 999}, "id": old["id"]})
            events[3] = codec.seal(prep, 3, old["ts"], old["prev"])[0]

        res = self._tamper(log, forge).verify()
        assert not res.ok and res.first_bad_seq == 4

    def test_reformatted_bytes_with_the_same_content_are_found(self, log: Log) -> None:
        self._filled(log, 6)

        def reformat(events: dict[int, bytes]) -> None:
            events[2] = orjson.dumps(orjson.loads(events[2]), option=orjson.OPT_INDENT_2)

        res = self._tamper(log, reformat).verify()
        assert not res.ok and res.first_bad_seq == 2 and "canonical" in (res.reason or "")

    # ---- properties ------------------------------------------------------------------------

    # Each backend subclass runs this test on its own instance: that is the point, not a flake.
    @settings(max_examples=40, suppress_health_check=[HealthCheck.differing_executors])
    @given(st.lists(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4), min_size=1, max_size=5))
    def test_append_read_round_trip(self, tmp_path_factory: pytest.TempPathFactory, datas: list[dict[str, Any]]) -> None:
        lg = self.make_log(tmp_path_factory.mktemp("rt"))
        with lg:
            lg.append([ev(d=d) for d in datas])
            back = [e["data"]["d"] for e in lg.read()]
            assert codec.canonical(back) == codec.canonical(datas)
            assert lg.verify().ok


class GroupCommitContract:
    """For backends with write transactions: concurrent callers share them (``commits``
    counts the transactions this handle committed)."""

    make_log: Callable[[Path], Log]  # provided by the backend's test class

    def test_group_commit_shares_write_transactions(self, tmp_path: Path) -> None:
        with self.make_log(tmp_path) as lg:
            barrier = threading.Barrier(8)

            def work(w: int) -> None:
                barrier.wait()
                for i in range(40):
                    lg.append([ev(f"w{w}", i=i)])

            ts = [threading.Thread(target=work, args=(w,)) for w in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            commits = getattr(lg, "commits")
            assert lg.head()[0] == 320
            assert commits < 320 * 0.8, f"{commits} commits for 320 appends: no sharing"
            assert lg.verify().ok


class EraseContract:
    """For backends that erase: :meth:`eventlog.log.Log.erase` makes content unrecoverable
    through the log while the chain still verifies, and an unauthorised stub is tampering."""

    make_log: Callable[[Path], Log]  # provided by the backend's test class
    tamper: Callable[[Log, Edit], Log]

    def test_erase_keeps_the_chain_verifiable_and_the_content_gone(self, tmp_path: Path) -> None:
        lg = self.make_log(tmp_path)
        try:
            lg.append([ev("a", secret=f"MARKER-{i}") for i in range(5)] + [ev("b", keep=i) for i in range(3)])
            before = {e["seq"]: e for e in lg.read()}
            seq = lg.erase([1, 3, 4], {"reason": "user asked", "by": "test"})
            assert seq == 9 and lg.head()[0] == 9
            res = lg.verify()
            assert res.ok and res.erased == 3, res
            after = {e["seq"]: e for e in lg.read()}
            for q in (1, 3, 4):
                assert after[q]["erased"] is True and "data" not in after[q]
                assert {k: after[q][k] for k in ("hash", "id", "type", "session", "ts")} == \
                       {k: before[q][k] for k in ("hash", "id", "type", "session", "ts")}
            assert after[2] == before[2] and after[6] == before[6]
            record = after[9]
            assert record["type"] == "log.erased" and record["data"]["reason"] == "user asked"
            assert record["data"]["erased"] == [[1, before[1]["hash"]], [3, before[3]["hash"]], [4, before[4]["hash"]]]
            assert not any(b"MARKER-0" in raw or b"MARKER-2" in raw for _, raw in lg.read(raw=True))
            assert lg.erase([1, 3], {"reason": "again"}) == 0 and lg.head()[0] == 9  # erasing twice: nothing new
            assert lg.append([ev("a", more=1)]) == [10] and lg.verify().ok
            other = self.make_log(tmp_path / "copy")
            try:
                assert other.append_sealed(stored(lg)) == 10 and other.verify().ok and other.verify().erased == 3
            finally:
                other.close()
        finally:
            lg.close()

    def test_an_erased_stream_refuses_an_append_at_the_count_seen_before(self, tmp_path: Path) -> None:
        """An erase changes no stream's version (its events stay, as stubs), so a writer that
        counted a stream before it was erased must not append past the erase: an append at an
        expected version to a stream whose first and last events are erased is refused
        (ConcurrencyError, nothing written) — right after the erase and after a write of the
        same handle. A stream erased only in part (retention of old messages) takes it."""
        lg = self.make_log(tmp_path)
        try:
            lg.append([ev("e", n=0), ev("e", n=1), ev("p", n=0), ev("p", n=1), ev("s", n=0)])
            assert lg.append([ev("e", n=2)], expected_version=2) == [6]
            lg.erase([1, 2, 6], {"reason": "all of e"})
            lg.erase([3], {"reason": "the oldest of p"})
            for _ in range(2):
                head = lg.head()
                with pytest.raises(ConcurrencyError):
                    lg.append([ev("e", n=3)], expected_version=3)
                assert lg.head() == head and lg.stream_version("e") == 3
                lg.append([ev("s", more=1)])  # the next try goes out after a write of this handle
            assert lg.append([ev("p", n=2)], expected_version=2) == [lg.head()[0]]
            assert lg.stream_version("p") == 3 and lg.verify().ok
        finally:
            lg.close()

    def test_an_erase_of_streams_takes_what_they_hold_at_the_erase(self, tmp_path: Path) -> None:
        """``streams``: every event of those streams as of the erase, read inside it — an event
        appended after the caller read the stream is erased by the same record, so no erase needs
        a second round that a killed process would never make (outside audit, PostgreSQL: the
        events another host appended between the rounds stayed live)."""
        lg = self.make_log(tmp_path)
        try:
            lg.append([ev("e", secret="MARKER-0"), ev("k", n=0), ev("e", secret="MARKER-1")])
            read = [e["seq"] for e in lg.read_session("e")]
            lg.append([ev("e", secret="MARKER-2")])  # another writer, after the caller's read
            seq = lg.erase(read, {"reason": "all of e"}, streams=["e"])
            record = lg.get(seq)
            assert record is not None and [q for q, _ in record["data"]["erased"]] == [1, 3, 4]
            assert all(e.get("erased") for e in lg.read_session("e"))
            assert not any(b"MARKER-" in raw for _, raw in lg.read(raw=True))
            assert lg.get(2) is not None and not lg.get(2).get("erased")  # type: ignore[union-attr]
            with pytest.raises(ConcurrencyError):  # the stream is closed to writers that counted it
                lg.append([ev("e", n=9)], expected_version=3)
            assert lg.erase([], {"reason": "again"}, streams=["e"]) == 0 and lg.verify().ok
        finally:
            lg.close()

    def test_verify_names_events_an_erase_record_names_but_the_log_holds_whole(self, tmp_path: Path) -> None:
        """A copy or import made by a release before 2026-12-07 brought ``log.erased`` records
        without stubbing the events they name: the chain verifies, and the erased words stayed,
        found by nothing. ``verify`` counts them (``unerased``) and names their sessions (the
        remedy, erasing them again, is tested per backend on the bytes such a mirror holds)."""
        lg = self.make_log(tmp_path)
        lg.append([ev("a", secret="MARKER-0"), ev("k", n=0), ev("a", secret="MARKER-1"), ev("b", n=0)])
        whole = dict(lg.read(raw=True))
        lg.erase([1, 3], {"reason": "all of a"})
        res = lg.verify()
        assert res.ok and res.erased == 2 and res.unerased == 0 and res.unerased_sessions == []

        def unstub(events: dict[int, bytes]) -> None:  # what an earlier release's mirror holds
            events[1], events[3] = whole[1], whole[3]

        lg = self.tamper(lg, unstub)
        try:
            res = lg.verify()
            assert res.ok and res.erased == 0, res
            assert (res.unerased, res.unerased_sessions) == (2, ["a"]), res
            shown = res.to_dict()
            assert shown["unerased"] == 2 and shown["unerased_sessions"] == ["a"] and "unerased_named" not in shown
        finally:
            lg.close()

    def test_verify_counts_unerased_only_what_a_record_names_by_its_hash(self, tmp_path: Path) -> None:
        """``unerased`` counts an event a ``log.erased`` record names *with that event's hash*,
        as the import's stubbing does (``named_unerased``): a record naming a seq with another
        hash, or naming an erase record (never erased), named an innocent session (``erase its
        sessions again`` for a session no erase meant) or an event no erase can take (doctor
        unfinished for good). Also: an event erased and named by two records is not counted (the
        state a second erase of an earlier mirror leaves)."""
        envs = [{"type": "a.b", "v": 1, "session": "a", "id": "e", "ts": 1, "data": {"secret": "MARKER-0"}},
                {"type": "a.b", "v": 1, "session": "b", "id": "e", "ts": 2, "data": {"n": 0}}]
        raws = sealed_chain(envs)
        hashes = [codec.decode(r)["hash"] for r in raws]
        record = {"type": codec.ERASED_TYPE, "v": 1, "session": None, "id": "r", "ts": 3}
        raws += sealed_chain([dict(record, data={"reason": "x", "erased": [[1, "f" * 64]]})], hashes[-1], 3)
        hashes.append(codec.decode(raws[-1])["hash"])
        raws += sealed_chain([dict(record, data={"reason": "y", "erased": [[3, hashes[2]]]})], hashes[-1], 4)
        lg = self.make_log(tmp_path)
        try:
            lg.append_sealed(raws)
            assert [e["seq"] for e in lg.read() if codec.is_stub(e)] == []  # nothing named by its hash
            res = lg.verify()
            assert res.ok and (res.unerased, res.unerased_sessions) == (0, []), res
            seq = lg.erase([2], {"reason": "b"})
            res = lg.verify()
            assert res.ok and res.erased == 1 and (res.unerased, res.unerased_sessions) == (0, []), res
            assert lg.get(seq) is not None
        finally:
            lg.close()

    def test_stream_state_is_the_version_and_the_erase_mark(self, tmp_path: Path) -> None:
        """``stream_state(session)`` answers ``(stream_version, erase_mark)`` together (the
        adapters' read check, one round trip on a server): a stream's count and the seq of the
        last erase record, which an erase moves while no version changes."""
        lg = self.make_log(tmp_path)
        try:
            state = getattr(lg, "stream_state")
            assert state("e") == (0, 0) and state("never") == (0, 0)
            lg.append([ev("e", n=0), ev("k", n=0), ev("e", n=1)])
            assert state("e") == (2, 0) and state("k") == (1, 0)
            seq = lg.erase([1], {"reason": "one"})
            assert state("e") == (2, seq) == (lg.stream_version("e"), getattr(lg, "erase_mark")())
            assert state("never") == (0, seq) and state("k") == (1, seq)
        finally:
            lg.close()

    def test_bad_erase_requests_change_nothing(self, tmp_path: Path) -> None:
        lg = self.make_log(tmp_path)
        try:
            lg.append([ev("a", n=i) for i in range(3)])
            seq = lg.erase([2], {"reason": "x"})
            snapshot = stored(lg)
            for seqs, data in (([99], {}), ([seq], {}), (["2"], {}), ([1], {"erased": []}), ("1", {})):
                with pytest.raises(ValidationError):
                    lg.erase(seqs, data)  # type: ignore[arg-type]
            assert stored(lg) == snapshot
            with pytest.raises(ValidationError):
                lg.append([{"type": "log.erased", "session": None, "data": {"erased": []}}])
            assert stored(lg) == snapshot
        finally:
            lg.close()

    def test_an_unauthorised_stub_is_tampering(self, tmp_path: Path) -> None:
        lg = self.make_log(tmp_path)
        lg.append([ev("a", n=i) for i in range(6)])

        def forge_stub(events: dict[int, bytes]) -> None:
            events[4] = codec.canonical(codec.stub(codec.decode(events[4])))

        lg = self.tamper(lg, forge_stub)
        try:
            res = lg.verify()
            assert not res.ok and res.first_bad_seq == 4 and "erased" in (res.reason or ""), res
        finally:
            lg.close()

    def test_a_stub_whose_hash_was_changed_is_tampering(self, tmp_path: Path) -> None:
        lg = self.make_log(tmp_path)
        lg.append([ev("a", n=i) for i in range(6)])
        lg.erase([3], {"reason": "x"})

        def change(events: dict[int, bytes]) -> None:
            env = codec.decode(events[3])
            env["type"] = "test.other"  # what the erase record does not vouch for ... and the hash moves with it
            env["hash"] = "ab" * 32
            events[3] = codec.canonical(env)

        lg = self.tamper(lg, change)
        try:
            res = lg.verify()
            assert not res.ok and res.first_bad_seq in (3, 4), res
        finally:
            lg.close()
