"""The log contract, run against the in-memory reference log and the LMDB log alike."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventTooLargeError,
    ValidationError,
)
from eventlog.log import EventLog, codec
from eventlog.log.memory import MemoryLog


@pytest.fixture(params=["memory", "lmdb"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        lg: Any = MemoryLog(profile="t")
    else:
        lg = EventLog.open(tmp_path / "log", profile="t", durability="nosync")
    with lg:
        yield lg


def ev(session: str | None = "s1", **data: Any) -> dict[str, Any]:
    return {"type": "test.happened", "session": session, "data": data}


def snapshot(lg: Any) -> list[bytes]:
    return [bytes(v) for _, v in lg.read(raw=True)]


def test_empty_log_head_is_zero(log: Any) -> None:
    assert log.head() == (0, "0" * 64)
    assert list(log.read()) == []
    assert log.verify().ok


def test_seqs_are_gapless_from_one_and_chained(log: Any) -> None:
    assert log.append([ev(n=1)]) == [1]
    assert log.append([ev(n=2), ev(n=3)]) == [2, 3]
    envs = list(log.read())
    assert [e["seq"] for e in envs] == [1, 2, 3]
    assert envs[0]["prev"] == "0" * 64
    assert envs[1]["prev"] == envs[0]["hash"] and envs[2]["prev"] == envs[1]["hash"]
    assert log.head() == (3, envs[2]["hash"])
    assert all(isinstance(e["ts"], int) and e["ts"] > 1_600_000_000 * 10**9 for e in envs)


def test_envelope_shape(log: Any) -> None:
    log.append([{"type": "a.b", "session": "s", "data": {"x": [1, "two", None]}, "id": "my-id", "v": 3}])
    env = log.get(1)
    assert set(env) == {"seq", "id", "ts", "type", "v", "session", "data", "prev", "hash"}
    assert (env["id"], env["type"], env["v"], env["session"], env["data"]) == ("my-id", "a.b", 3, "s", {"x": [1, "two", None]})


def test_hash_is_sha256_of_prev_and_canonical_bytes(log: Any) -> None:
    import hashlib

    log.append([ev(text="héllo ☃")])
    env = log.get(1)
    body = {k: v for k, v in env.items() if k != "hash"}
    expect = hashlib.sha256(bytes.fromhex(env["prev"]) + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert env["hash"] == expect


BAD_EVENTS = [
    ("events[1]", "not an object"),
    ("events[1].data", {"type": "a.b", "session": "s", "data": [1, 2]}),
    ("events[1].data", {"type": "a.b", "session": "s"}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": float("nan")}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": float("inf")}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": "bad \ud800 surrogate"}}),
    ("events[1].data", {"type": "a.b", "session": "s", "data": {"key \udfff": 1}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": b"bytes"}}),
    ("events[1].data.x", {"type": "a.b", "session": "s", "data": {"x": 2**70}}),
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


@pytest.mark.parametrize("field,bad", BAD_EVENTS)
def test_bad_input_is_refused_naming_the_field_and_appends_nothing(log: Any, field: str, bad: Any) -> None:
    log.append([ev(n=0)])
    before = (log.head(), snapshot(log))
    with pytest.raises(ValidationError) as info:
        log.append([ev(n=1), bad])
    assert info.value.field.startswith(field), info.value.field
    assert (log.head(), snapshot(log)) == before


def test_event_over_size_limit_is_refused(log: Any) -> None:
    with pytest.raises(EventTooLargeError) as info:
        log.append([ev(blob="x" * codec.MAX_EVENT_BYTES)])
    assert info.value.field == "events[0].data"
    assert log.head()[0] == 0


def test_deep_nesting_is_refused(log: Any) -> None:
    deep: Any = "leaf"
    for _ in range(100):
        deep = {"d": deep}
    with pytest.raises(ValidationError):
        log.append([ev(x=deep)])
    assert log.head()[0] == 0


def test_retry_with_same_ids_returns_original_seqs_and_writes_nothing(log: Any) -> None:
    batch = [dict(ev(n=1), id="e-1"), dict(ev(n=2), id="e-2")]
    assert log.append(batch) == [1, 2]
    head = log.head()
    assert log.append(batch) == [1, 2]
    assert log.head() == head


def test_a_null_id_is_an_absent_id(log: Any) -> None:
    seqs = log.append([dict(ev(n=1), id=None), dict(ev(n=1), id=None)])
    assert seqs == [1, 2]  # two generated, distinct ids: no idempotent replay of each other
    ids = [e["id"] for e in log.read(1)]
    assert all(isinstance(i, str) and i for i in ids) and ids[0] != ids[1]


def test_partly_replayed_batch_appends_only_new_events(log: Any) -> None:
    log.append([dict(ev(n=1), id="e-1")])
    assert log.append([dict(ev(n=2), id="e-2"), dict(ev(n=1), id="e-1")]) == [2, 1]
    assert log.head()[0] == 2


def test_same_id_with_other_content_is_a_typed_error(log: Any) -> None:
    log.append([dict(ev(n=1), id="e-1")])
    before = snapshot(log)
    with pytest.raises(DuplicateEventError) as info:
        log.append([dict(ev(n=3), id="e-new"), dict(ev(n=2), id="e-1")])
    assert info.value.seq == 1
    assert snapshot(log) == before


def test_duplicate_id_inside_one_batch_is_refused(log: Any) -> None:
    with pytest.raises(ValidationError):
        log.append([dict(ev(n=1), id="x"), dict(ev(n=2), id="x")])
    assert log.head()[0] == 0


def test_expected_version_guards_a_stream(log: Any) -> None:
    log.append([ev("a", n=1), ev("b", n=1)])
    assert log.stream_version("a") == 1
    assert log.append([ev("a", n=2)], expected_version=1) == [3]
    with pytest.raises(ConcurrencyError) as info:
        log.append([ev("a", n=3)], expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert log.head()[0] == 3
    assert log.append([ev("new", n=1)], expected_version=0) == [4]


def test_expected_version_needs_one_stream(log: Any) -> None:
    with pytest.raises(ValidationError):
        log.append([ev("a"), ev("b")], expected_version=0)


def test_read_ranges_and_sessions(log: Any) -> None:
    for i in range(10):
        log.append([ev("even" if i % 2 == 0 else "odd", i=i)])
    assert [e["seq"] for e in log.read(4, 7)] == [4, 5, 6, 7]
    assert [e["seq"] for e in log.read(9)] == [9, 10]
    assert [e["data"]["i"] for e in log.read_session("odd")] == [1, 3, 5, 7, 9]
    assert list(log.read_session("missing")) == []
    assert log.get(11) is None and log.get(3)["data"] == {"i": 2}


def test_follow_yields_events_as_they_land(log: Any) -> None:
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


def test_follow_stops_after_idle_timeout(log: Any) -> None:
    log.append([ev(n=1)])
    assert [e["seq"] for e in log.follow(1, timeout=0.1)] == [1]


def test_concurrent_threads_get_one_gapless_order(log: Any) -> None:
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
    seqs = sorted(s for r in results for s in r)
    assert seqs == list(range(1, 321))
    for w in range(8):
        assert [e["data"]["i"] for e in log.read_session(f"w{w}")] == list(range(40))
    assert log.verify().ok


def test_an_error_fails_only_its_own_caller(log: Any) -> None:
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


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60)
@given(st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=4), min_size=1, max_size=5))
def test_append_read_round_trip(tmp_path_factory: pytest.TempPathFactory, datas: list[dict[str, Any]]) -> None:
    for lg in (MemoryLog(), EventLog.open(tmp_path_factory.mktemp("rt") / "log", durability="nosync")):
        with lg:
            lg.append([ev(**{"d": d}) for d in datas])
            back = [e["data"]["d"] for e in lg.read()]
            assert codec.canonical(back) == codec.canonical(datas)
            assert lg.verify().ok


@settings(max_examples=200)
@given(
    data=st.dictionaries(st.text(max_size=8), json_values, max_size=5),
    session=st.none() | st.from_regex(codec.ID_RE, fullmatch=True),
    etype=st.from_regex(codec.TYPE_RE, fullmatch=True).filter(lambda t: len(t) <= 128),
    v=st.integers(1, 1000),
    eid=st.none() | st.from_regex(codec.ID_RE, fullmatch=True),
    seq=st.integers(1, 2**40),
    ts=st.integers(0, 2**62),
    prev=st.binary(min_size=32, max_size=32).map(bytes.hex),
)
def test_sealed_bytes_are_the_canonical_encoding(
    data: dict[str, Any], session: str | None, etype: str, v: int, eid: str | None, seq: int, ts: int, prev: str
) -> None:
    event: dict[str, Any] = {"type": etype, "session": session, "data": data, "v": v}
    if eid is not None:
        event["id"] = eid
    p = codec.prepare(event)
    raw, digest = codec.seal(p, seq, ts, prev)
    env = codec.decode(raw)
    assert codec.canonical(env) == raw
    assert env["hash"] == digest
    assert (env["type"], env["v"], env["session"], env["seq"], env["ts"], env["prev"]) == (etype, v, session, seq, ts, prev)
    assert env["id"] == (eid if eid is not None else p.id)
    assert codec.check_stored(raw, seq, prev)[1] is None
