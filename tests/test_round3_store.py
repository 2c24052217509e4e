"""Round-3 outside audit (helper-61) of SessionStore as a library embeds it: open options on a
profile already open in the process, a closed handle beside open ones, bad arguments to
read_model, extension validators that fail in their own way -- and a hypothesis state machine
comparing paged reads, extension read models, reopen and rebuild with a plain model."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import ClosedError, ValidationError
from eventlog.sessions.extensions import EventType, Extension, ReadModel
from eventlog.sessions.store import SessionStore


def _apply_tally(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
    if env.get("type") == "tally.counted":
        conn.execute("INSERT INTO tally_counts (seq, stream, n) VALUES (?, ?, ?)",
                     (env["seq"], env["session"], env["data"]["n"]))


def _check_count(data: dict[str, Any]) -> dict[str, Any]:
    return {"n": int(data["n"])}  # a KeyError / TypeError / ValueError on data it does not expect


TALLY = Extension("tally", event_types=[EventType("tally.counted", 1, validate=_check_count)],
                  read_models=[ReadModel("tally", 1, ["CREATE TABLE tally_counts (seq INTEGER PRIMARY KEY, "
                                                      "stream TEXT, n INTEGER)"], _apply_tally)])


@pytest.mark.parametrize("option", [{"lock_timeout": "x"}, {"batch_size": "x"}, {"batch_size": 0},
                                    {"check": 1}, {"durability": "bogus"}, {"map_size": -1}])
def test_an_open_of_a_profile_already_open_refuses_the_bad_options_a_first_open_refuses(
        tmp_path: Path, option: dict[str, Any]) -> None:
    name = next(iter(option))
    with pytest.raises(ValidationError) as first:
        SessionStore.open(tmp_path, "fresh", follower=False, **option)
    assert first.value.field == name
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        with pytest.raises(ValidationError) as again:
            SessionStore.open(tmp_path, "p", follower=False, **option)
        assert again.value.field == name
        store.create_session(source="cli")  # the open handle is untouched


def test_a_closed_handle_refuses_erase_mark_while_another_handle_is_open(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as kept:
        closed = SessionStore.open(tmp_path, "p", follower=False)
        closed.close()
        with pytest.raises(ClosedError):
            closed.erase_mark()
        assert kept.erase_mark() == 0


@pytest.mark.parametrize("wait", ["x", None, True, float("nan"), -1])
def test_read_model_refuses_a_wait_that_is_not_seconds(tmp_path: Path, wait: Any) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[TALLY], follower=False) as store:
        with pytest.raises(ValidationError) as info:
            with store.read_model("tally", wait=wait):
                pass
        assert info.value.field == "wait"


@pytest.mark.parametrize("data", [{}, {"n": "many"}, {"n": [1]}])
def test_a_validator_failing_in_its_own_way_is_a_validation_error_naming_the_event(
        tmp_path: Path, data: dict[str, Any]) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[TALLY], follower=False) as store:
        good = {"type": "tally.counted", "session": "t1", "data": {"n": 1}}
        head = store.log.head()
        for call in (store.check_events, store.append_events):
            with pytest.raises(ValidationError) as info:
                call([good, {"type": "tally.counted", "session": "t1", "data": data}])
            assert info.value.field == "events[1].data"
            assert "tally.counted" in info.value.problem
        assert store.log.head() == head


# ---- a state machine over what tests/test_store_stateful.py leaves out --------------------------
# Paged reads (limit / before / after / newest_first, with rewinds), an extension's event type and
# read model beside the catalogue's events (mixed batches, bad events), the store closed and opened
# again (with and without a follower, and once without the extension, which then appends and
# rebuilds state.db without its tables), and rebuilds of either file.

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule  # noqa: E402


def _page(ids: list[int], *, limit: int | None, before: int | None, after: int | None,
          newest_first: bool) -> list[int]:
    """docs: after < id < before, chronological; with limit the latest ``limit`` -- or, paging
    forward (after given, before not), the first ``limit`` after ``after``."""
    picked = [m for m in ids if (after is None or m > after) and (before is None or m < before)]
    if limit is not None:
        picked = picked[:limit] if after is not None and before is None else picked[max(0, len(picked) - limit):]
    return picked[::-1] if newest_first else picked


class PagedStoreMachine(RuleBasedStateMachine):
    sessions = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.home = tempfile.mkdtemp(prefix="eventlog-round3-")
        self.store = SessionStore.open(self.home, "p", extensions=[TALLY], follower=False, durability="nosync")
        self.messages: dict[str, list[int]] = {}  # live session -> every message id, in order
        self.inactive: dict[str, set[int]] = {}
        self.gone: set[str] = set()
        self.tally: list[tuple[int, str, int]] = []  # (seq, stream, n): the read model's rows

    def teardown(self) -> None:
        import shutil

        self.store.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def _head(self) -> int:
        return self.store.log.head()[0]

    @rule(target=sessions)
    def create(self) -> str:
        sid = self.store.create_session(source="cli")
        self.messages[sid], self.inactive[sid] = [], set()
        return sid

    @rule(sid=sessions, n=st.integers(1, 4))
    def append(self, sid: str, n: int) -> None:
        if sid not in self.messages:
            return
        self.messages[sid] += self.store.append_messages(sid, [{"role": "user", "content": f"m{i}"} for i in range(n)])

    @rule(sid=sessions, counts=st.lists(st.integers(-5, 5), min_size=1, max_size=3), with_message=st.booleans())
    def append_tally(self, sid: str, counts: list[int], with_message: bool) -> None:
        events: list[dict[str, Any]] = [{"type": "tally.counted", "session": sid, "data": {"n": n}} for n in counts]
        if with_message and sid in self.messages:
            events.append({"type": "message.appended", "session": sid, "data": {"role": "assistant", "content": "x"}})
        seqs = self.store.append_events(events)
        self.tally += [(seq, sid, n) for seq, n in zip(seqs, counts)]
        if with_message and sid in self.messages:
            self.messages[sid].append(seqs[-1])

    @rule(sid=sessions, bad=st.sampled_from([{}, {"n": "x"}, None]))
    def append_a_bad_tally(self, sid: str, bad: Any) -> None:
        head = self._head()
        with pytest.raises(ValidationError) as info:
            self.store.append_events([{"type": "tally.counted", "session": sid, "data": {"n": 1}},
                                      {"type": "tally.counted", "session": sid, "data": bad}])
        assert info.value.field == "events[1].data"
        assert self._head() == head

    @rule(sid=sessions, pick=st.integers(0, 50))
    def rewind(self, sid: str, pick: int) -> None:
        active = [m for m in self.messages.get(sid, []) if m not in self.inactive[sid]]
        if not active:
            return
        mid = active[pick % len(active)]
        self.store.rewind(sid, mid)
        self.inactive[sid].update(m for m in self.messages[sid] if m >= mid)

    @rule(sid=sessions)
    def delete(self, sid: str) -> None:
        if sid not in self.messages:
            return
        self.store.delete_session(sid)
        del self.messages[sid], self.inactive[sid]
        self.gone.add(sid)

    @rule(follower=st.booleans())
    def reopen(self, follower: bool) -> None:
        self.store.close()
        self.store = SessionStore.open(self.home, "p", extensions=[TALLY], follower=follower, durability="nosync")

    @rule(sid=sessions, rebuild=st.booleans())
    def reopen_without_the_extension(self, sid: str, rebuild: bool) -> None:
        """A program that does not know the extension appends (and rebuilds state.db without
        its tables); the next open with the extension finds its read model whole."""
        self.store.close()
        with SessionStore.open(self.home, "p", follower=False, durability="nosync") as plain:
            if sid in self.messages:
                self.messages[sid].append(plain.append_message(sid, "user", "from a plain open"))
            if rebuild:
                plain.rebuild("state")
        self.store = SessionStore.open(self.home, "p", extensions=[TALLY], follower=False, durability="nosync")

    @rule(which=st.sampled_from(["all", "state", "fts"]))
    def rebuild(self, which: str) -> None:
        self.store.rebuild(which)

    @rule(sid=sessions, limit=st.none() | st.integers(0, 6), before=st.none() | st.integers(0, 80),
          after=st.none() | st.integers(0, 80), newest_first=st.booleans(), include_inactive=st.booleans())
    def read_a_page(self, sid: str, limit: int | None, before: int | None, after: int | None,
                    newest_first: bool, include_inactive: bool) -> None:
        got = [m["id"] for m in self.store.get_messages(sid, limit=limit, before=before, after=after,
                                                        newest_first=newest_first, include_inactive=include_inactive)]
        ids = self.messages.get(sid, [])
        if not include_inactive:
            ids = [m for m in ids if m not in self.inactive[sid]]
        assert got == _page(ids, limit=limit, before=before, after=after, newest_first=newest_first)

    @invariant()
    def reads_match_the_model(self) -> None:
        store = self.store
        for sid, ids in self.messages.items():
            assert [m["id"] for m in store.get_messages(sid)] == [m for m in ids if m not in self.inactive[sid]]
            assert [(m["id"], m["active"]) for m in store.get_messages(sid, include_inactive=True)] == [
                (m, m not in self.inactive[sid]) for m in ids]
        for sid in self.gone:
            assert store.get_session(sid) is None and store.get_messages(sid, include_inactive=True) == []
        with store.read_model("tally") as conn:
            assert conn.execute("SELECT seq, stream, n FROM tally_counts ORDER BY seq").fetchall() == self.tally


TestPagedStore = PagedStoreMachine.TestCase
TestPagedStore.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_an_open_refused_for_one_of_its_extensions_registers_none_of_them(tmp_path: Path) -> None:
    first = Extension("bb", event_types=[EventType("bb.x")])
    fine, clash = Extension("aa", event_types=[EventType("aa.x")]), Extension("bb", event_types=[EventType("bb.y")])
    with SessionStore.open(tmp_path, "p", extensions=[first], follower=False) as store:
        for refused in ([fine, clash], [fine, "not an extension"]):
            with pytest.raises(ValidationError) as info:
                SessionStore.open(tmp_path, "p", extensions=refused, follower=False)
            assert info.value.field == "extensions"
        head = store.log.head()
        with pytest.raises(ValidationError) as unknown:
            store.append_events([{"type": "aa.x", "data": {}}])
        assert unknown.value.field == "events[0].type"
        assert store.log.head() == head
        assert store.append_events([{"type": "bb.x", "data": {}}]) == [head[0] + 1]


def test_an_open_racing_the_close_of_the_last_other_handle_gets_a_working_store(tmp_path: Path) -> None:
    """Library B opens the profile in one thread while library A closes its store, the only one
    open, in another: B's store works (it was handed the core A's close had just closed)."""
    import threading

    inside, closed = threading.Event(), threading.Event()

    class HeldOpen(list):  # type: ignore[type-arg]
        """No extensions; iterating them holds this open at the point A's close must hit."""

        def __iter__(self) -> Any:
            inside.set()
            closed.wait(30)
            return super().__iter__()

    a = SessionStore.open(tmp_path, "p", follower=False)
    sid = a.create_session(source="cli")
    got: dict[str, Any] = {}

    def open_b() -> None:
        try:
            got["store"] = SessionStore.open(tmp_path, "p", follower=False, extensions=HeldOpen())
        except BaseException as e:  # noqa: BLE001 - reported below
            got["error"] = e

    thread = threading.Thread(target=open_b)
    thread.start()
    assert inside.wait(30)
    a.close()
    closed.set()
    thread.join()
    assert "error" not in got, got
    with got["store"] as b:
        mid = b.append_message(sid, "user", "after A closed")
        assert [m["id"] for m in b.get_messages(sid)] == [mid]
    with SessionStore.open(tmp_path, "p", follower=False) as c:  # B's close closed it: a new core, the message kept
        assert [m["content"] for m in c.get_messages(sid)] == ["after A closed"]


def _tally_extension(version: int = 1) -> Extension:
    """TALLY built anew at each call, as a library that makes its extension at each open."""
    return Extension("tally", event_types=[EventType("tally.counted", version, validate=_check_count)],
                     read_models=[ReadModel("tally", version, ["CREATE TABLE tally_counts (seq INTEGER PRIMARY KEY, "
                                                               "stream TEXT, n INTEGER)"], _apply_tally)])


def test_a_second_open_in_the_process_with_the_same_extension_built_again_is_served(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[_tally_extension()], follower=False) as first:
        with SessionStore.open(tmp_path, "p", extensions=[_tally_extension()], follower=False) as second:
            seq = second.append_events([{"type": "tally.counted", "session": "t", "data": {"n": 3}}])[0]
            with first.read_model("tally") as conn:
                assert conn.execute("SELECT seq, n FROM tally_counts").fetchall() == [(seq, 3)]
        with pytest.raises(ValidationError) as other:  # another definition of the namespace still is refused
            SessionStore.open(tmp_path, "p", extensions=[_tally_extension(2)], follower=False)
        assert other.value.field == "extensions"


def test_an_sql_error_in_a_read_models_apply_stops_it_alone(tmp_path: Path) -> None:
    """A read model whose apply writes a column its table lacks: the core reads go on (they met
    the raw sqlite3 error), and its readers hear a ProjectionError naming the fault."""
    from eventlog.errors import ProjectionError

    def wrong_column(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
        if env.get("type") == "tally.counted":
            conn.execute("INSERT INTO tally_counts (nope) VALUES (1)")

    ext = Extension("tally", event_types=[EventType("tally.counted", 1, validate=_check_count)],
                    read_models=[ReadModel("tally", 1, ["CREATE TABLE tally_counts (seq INTEGER PRIMARY KEY)"],
                                           wrong_column)])
    with SessionStore.open(tmp_path, "p", extensions=[ext], follower=False) as store:
        sid = store.create_session(source="cli")
        store.append_events([{"type": "tally.counted", "session": "t", "data": {"n": 1}}])
        mid = store.append_message(sid, "user", "the core keeps going")
        assert [m["id"] for m in store.get_messages(sid)] == [mid]
        assert store.get_session(sid)["message_count"] == 1
        with pytest.raises(ProjectionError, match="no column named nope"):
            with store.read_model("tally"):
                pass
        assert store.health()["ok"]


@pytest.mark.parametrize("ddl,problem", [(["CREATE TABLE tally_counts (seq"], "incomplete input"),
                                         (["CREATE TABLE elsewhere (seq)"], "outside its prefix")])
def test_a_read_model_whose_ddl_fails_is_refused_at_open_naming_it(tmp_path: Path, ddl: list[Any],
                                                                   problem: str) -> None:
    from eventlog.errors import ProjectionError

    with SessionStore.open(tmp_path, "p", follower=False) as plain:
        sid = plain.create_session(source="cli")
    bad = Extension("tally", event_types=[EventType("tally.counted")],
                    read_models=[ReadModel("tally", 1, ddl, _apply_tally)])
    with pytest.raises(ProjectionError, match=problem) as info:
        SessionStore.open(tmp_path, "p", extensions=[bad], follower=False)
    assert "tally" in str(info.value)
    with SessionStore.open(tmp_path, "p", follower=False) as plain:  # the profile is untouched
        assert plain.get_session(sid) is not None and plain.health()["ok"]
        tables = {r[0] for r in sqlite3.connect(tmp_path / "profiles" / "p" / "state.db").execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "elsewhere" not in tables


def _apply_nothing(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize("make,field", [
    (lambda: Extension("tally", event_types=EventType("tally.a")), "event_types"),  # not a list
    (lambda: Extension("tally", event_types=["tally.a"]), "event_types"),
    (lambda: Extension("tally", event_types=[EventType("tally.a", validate=3)]), "event_types"),  # type: ignore[arg-type]
    (lambda: Extension("tally", event_types=[EventType("tally.a", 2, upcasters=[dict])]), "event_types"),  # type: ignore[arg-type]
    (lambda: Extension("tally", event_types=[EventType("tally.a", 2, upcasters={"1": dict})]), "event_types"),
    (lambda: Extension("tally", read_models=ReadModel("tally", 1, [], _apply_nothing)), "read_models"),
    (lambda: Extension("tally", read_models=[ReadModel("tally", 1, "CREATE TABLE tally_t (x)", _apply_nothing)]),
     "read_models"),
    (lambda: Extension("tally", read_models=[ReadModel("tally", 1, [42], _apply_nothing)]), "read_models"),  # type: ignore[list-item]
    (lambda: Extension("tally", read_models=[ReadModel("tally", 1, [], None)]), "read_models"),  # type: ignore[arg-type]
])
def test_an_extension_defined_wrongly_is_refused_where_it_is_defined(make: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    assert info.value.field == field
