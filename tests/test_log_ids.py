"""The LMDB log's id index: ids it generates are derived from the event's seq and need no row.

An event appended without an id gets ``codec.derived_id(ts, seq)`` and is found at that seq;
every other id keeps its row in ``ids``. These tests hold the promises that rest on it: ids stay
unique (also against a caller who picks an id of the derived form ahead of its seq), a retried
id returns its original seq, and logs whose generated ids all have rows (every earlier release)
keep working.
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import eventlog.log.lmdb as logmod
from eventlog.errors import DuplicateEventError
from eventlog.log import codec
from eventlog.log.lmdb import EventLog

DATA = Path(__file__).parent / "data"


def ev(n: int, session: str | None = "s", eid: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "test.said", "session": session, "data": {"n": n}}
    if eid is not None:
        out["id"] = eid
    return out


def id_rows(lg: EventLog) -> dict[str, int]:
    core = lg._core
    with core._env.begin() as txn:
        return {bytes(k).decode(): logmod.key_seq(bytes(v)) for k, v in txn.cursor(db=core._ids)}


def test_generated_ids_are_derived_from_ts_and_seq_and_have_no_index_row(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([ev(1), ev(2, session=None), ev(3, eid="mine")])
        lg.append([ev(4)])
        events = list(lg.read())
        assert [e["id"] for e in events if e["seq"] != 3] == \
            [codec.derived_id(e["ts"], e["seq"]) for e in events if e["seq"] != 3]
        assert id_rows(lg) == {"mine": 3}  # one row: the caller's id
        assert [lg.event_seq(e["id"]) for e in events] == [1, 2, 3, 4]
        assert lg.event_seq(codec.derived_id(events[0]["ts"], 2)) is None  # right form, wrong event
        assert lg.event_seq(codec.derived_id(events[0]["ts"], 99)) is None  # a seq not written
        assert lg.verify().ok


def test_a_caller_id_of_the_derived_form_ahead_of_its_seq_is_never_generated_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller may pick any id, also one a later append would derive: its row raises the
    log's ``idclaim`` and the append that reaches that seq at that very nanosecond takes the
    next one -- in another process, after a reopen, as in the same group."""
    ts = 1_800_000_000_000_000_000
    taken = codec.derived_id(ts, 5)
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        assert lg.append([ev(1, eid=taken)]) == [1]
    clock = [ts]

    def fixed_clock() -> int:
        return clock[0]

    monkeypatch.setattr(logmod.time, "time_ns", fixed_clock)
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        assert lg.append([ev(2), ev(3), ev(4)]) == [2, 3, 4]
        assert lg.append([ev(5)]) == [5]
        fifth = lg.get(5)
        assert fifth is not None and fifth["id"] == codec.derived_id(ts + 1, 5) and fifth["ts"] == ts + 1
        ids = [e["id"] for e in lg.read()]
        assert len(set(ids)) == 5
        assert lg.event_seq(taken) == 1 and lg.event_seq(fifth["id"]) == 5
        # ... and inside one write group: a claim made earlier in the group counts.
        later = codec.derived_id(ts, 7)
        assert lg.append([ev(6, eid=later), ev(7)]) == [6, 7]
        seventh = lg.get(7)
        assert seventh is not None and seventh["id"] == codec.derived_id(ts + 1, 7)
        assert lg.event_seq(later) == 6 and lg.verify().ok


def test_a_caller_id_of_the_derived_form_naming_a_written_seq_is_an_ordinary_id(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([ev(1)])
        other = codec.derived_id(123, 1)  # seq 1 holds another id
        assert lg.append([ev(2, eid=other)]) == [2]
        assert id_rows(lg) == {other: 2}
        assert lg.event_seq(other) == 2 and lg.append([ev(2, eid=other)]) == [2]
        with pytest.raises(DuplicateEventError):
            lg.append([ev(3, eid=other)])
        assert lg.head()[0] == 2


def test_a_replay_inside_one_group_finds_an_id_derived_earlier_in_it(tmp_path: Path) -> None:
    """The derived id of an event earlier in the same write group is found before its rows are
    in the tables (the group writes them at its end)."""
    from eventlog.log.base import prepare_batch
    from eventlog.log.lmdb import _Request

    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        core = lg._core
        clock = [1_900_000_000_000_000_000]
        first = _Request(prepare_batch([ev(1)], None), None, None)
        core_ts = codec.derived_id(clock[0], 1)
        replay = _Request(prepare_batch([ev(1, eid=core_ts)], None), None, None)
        other = _Request(prepare_batch([ev(2, eid=core_ts)], None), None, None)
        original = logmod.time.time_ns
        logmod.time.time_ns = lambda: clock[0]  # type: ignore[assignment]
        try:
            core._commit_group([first, replay, other])
        finally:
            logmod.time.time_ns = original  # type: ignore[assignment]
        assert first.seqs == [1] and replay.seqs == [1]
        assert isinstance(other.error, DuplicateEventError) and other.error.seq == 1
        assert lg.head()[0] == 1 and id_rows(lg) == {}


def test_an_import_of_sealed_events_keeps_derived_ids_rowless_and_unique(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([ev(i) for i in range(5)] + [ev(9, eid="named")])
        events = list(a.read())
    raws = [codec.canonical(e) for e in events]  # an export's events, sealed
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        assert b.append_sealed(raws) == 6
        assert id_rows(b) == {"named": 6}
        assert [b.event_seq(e["id"]) for e in events] == [1, 2, 3, 4, 5, 6]
        replay = {k: events[2][k] for k in ("type", "session", "data", "id")}
        assert b.append([replay]) == [3] and b.head()[0] == 6 and b.verify().ok


def test_compaction_keeps_every_id_found(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([ev(i) for i in range(50)] + [ev(99, eid="kept")])
        before = [(e["id"], e["seq"]) for e in lg.read()]
        lg.compact()
        assert [lg.event_seq(i) for i, _ in before] == [s for _, s in before]
        assert lg.verify().ok


def test_a_log_of_the_first_release_keeps_its_generated_ids_rows(tmp_path: Path) -> None:
    """tests/data/format1-log.tgz: every id of it has a row (generated ids included), and ids
    of :func:`codec.new_id`'s form read as seqs beyond any log's; a retry of one still replays."""
    with tarfile.open(DATA / "format1-log.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    path = next(p.parent for p in tmp_path.rglob("data.mdb"))
    with EventLog.open(path, durability="nosync") as lg:
        events = list(lg.read())
        generated = [e for e in events if codec.derived_seq(e["id"]) == 0 and len(e["id"]) == 32]
        assert generated, "the fixture has generated ids"
        rows = id_rows(lg)
        assert all(rows[e["id"]] == e["seq"] for e in events)
        e = generated[-1]
        head = lg.head()
        assert lg.append([{k: e[k] for k in ("type", "session", "data", "id")}]) == [e["seq"]]
        assert lg.head() == head
        seq = lg.append([ev(1)])[0]
        new = lg.get(seq)
        assert new is not None and new["id"] == codec.derived_id(new["ts"], seq) and lg.event_seq(new["id"]) == seq


def test_ids_stay_unique_when_two_processes_append_without_ids(tmp_path: Path) -> None:
    path = tmp_path / "log"
    EventLog.open(path).close()
    script = textwrap.dedent(f"""
        from eventlog.log.lmdb import EventLog
        with EventLog.open({str(path)!r}, durability="nosync") as lg:
            for i in range(200):
                lg.append([{{"type": "test.said", "session": "p", "data": {{"i": i}}}}] * 3)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with EventLog.open(path, durability="nosync") as lg:
        events = list(lg.read())
        assert len(events) == 1200 and len({e["id"] for e in events}) == 1200
        assert all(e["id"] == codec.derived_id(e["ts"], e["seq"]) for e in events)
        assert id_rows(lg) == {} and lg.verify().ok


def sealed_chain(ids: list[str]) -> list[bytes]:
    """Stored bytes of a chain of events with these ids (no log checked them)."""
    raws, prev = [], codec.ZERO_HASH
    for seq, eid in enumerate(ids, 1):
        raw, prev = codec.seal(codec.prepare(ev(seq, eid=eid)), seq, 1_700_000_000_000_000_000 + seq, prev)
        raws.append(raw)
    return raws


@pytest.mark.parametrize("ids", [
    [codec.derived_id(1_700_000_000_000_000_001, 1)] * 2,  # derived at seq 1, used again at seq 2
    [codec.derived_id(1_700_000_000_000_000_002, 2)] * 2,  # taken by seq 1 ahead of seq 2, derived there
    ["plain", "plain"],
])
def test_an_import_of_sealed_events_refuses_an_id_used_twice(tmp_path: Path, ids: list[str]) -> None:
    from eventlog.errors import IntegrityError

    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        with pytest.raises(IntegrityError, match="already used id"):
            lg.append_sealed(sealed_chain(ids))
        assert lg.head()[0] == 0
        assert lg.append_sealed(sealed_chain(ids[:1])) == 1 and lg.event_seq(ids[0]) == 1


CLOCK = 1_750_000_000_000_000_000


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(1, 40), st.sampled_from(["a", "b", "c"])),
                         min_size=1, max_size=4), min_size=1, max_size=12),
       st.integers(0, 3))
@example(batches=[[None, 1]], ticks=0)  # a chosen id for the seq its own request's first event gets
def test_ids_stay_unique_and_found_under_any_mix_of_generated_and_chosen_ids(
        tmp_path_factory: pytest.TempPathFactory, batches: list[list[Any]], ticks: int) -> None:
    """Batches of events without an id (None), with a caller id of the derived form naming a
    seq (an int: the id an append at that seq would get at the frozen clock), or a plain caller
    id; the clock advances ``ticks`` ns an append, so derived ids collide with chosen ones
    whenever they can. Every id stays unique, is found at its seq, and replays."""
    path = tmp_path_factory.mktemp("ids") / "log"
    clock = [CLOCK]

    def now() -> int:
        clock[0] += ticks
        return clock[0]

    original = logmod.time.time_ns
    logmod.time.time_ns = now  # type: ignore[assignment]
    try:
        with EventLog.open(path, durability="nosync") as lg:
            for b, batch in enumerate(batches):
                events = []
                for k, spec in enumerate(batch):
                    eid = None if spec is None else (codec.derived_id(CLOCK + ticks * spec, spec)
                                                     if isinstance(spec, int) else f"{spec}{b}")
                    events.append(ev(b * 10 + k, eid=eid))
                if len({e.get("id") for e in events if "id" in e}) < sum(1 for e in events if "id" in e):
                    continue  # the same id twice in one batch is refused before any of this
                try:
                    lg.append(events)
                except DuplicateEventError:
                    pass  # a chosen id that an earlier event holds with other content
            stored_events = list(lg.read())
            ids = [e["id"] for e in stored_events]
            assert len(set(ids)) == len(ids)
            assert [lg.event_seq(i) for i in ids] == [e["seq"] for e in stored_events]
            for e in stored_events:
                assert lg.append([{k: e[k] for k in ("type", "session", "data", "id")}]) == [e["seq"]]
            assert lg.head()[0] == len(stored_events) and lg.verify().ok
    finally:
        logmod.time.time_ns = original  # type: ignore[assignment]


def test_an_erased_event_keeps_its_derived_id_found(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([ev(1), ev(2)])
        first = lg.get(1)
        assert first is not None
        lg.erase([1], {"reason": "test"})
        assert lg.event_seq(first["id"]) == 1
        with pytest.raises(DuplicateEventError):  # its content is gone: a replay cannot match it
            lg.append([{k: first[k] for k in ("type", "session", "data", "id")}])
        assert lg.head()[0] == 3 and lg.verify().ok
