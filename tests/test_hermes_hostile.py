"""The Hermes facade under hostile arguments: each case was found by driving every public
method of Hermes' ``hermes_state.SessionDB`` (0.19.0) and eventlog's side by side with odd
values (NaN, None for a string, lists, lone surrogates, huge ints) and comparing the exception
type, the result and every row afterwards. The unmarked tests check the facade alone against
what Hermes was seen to do; the ``hermes`` ones compare with the real class."""
from __future__ import annotations

import datetime
import math
import sqlite3
import sys
import time as real_time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from eventlog.adapters.hermes import SessionDB
from eventlog.adapters.hermes.db import UnsupportedRawWrite

sys.path.insert(0, str(Path(__file__).parent))
from test_hermes_adapter import RAW_CALLBACKS, RAW_OUTCOMES  # noqa: E402
from test_hermes_adapter import dump as adapter_dump  # noqa: E402
from test_hermes_differential import Clock  # noqa: E402

try:
    import hermes_state
except ImportError:  # the hermes-marked tests skip; the others need no Hermes
    hermes_state = None

TABLES = ("sessions", "messages", "session_model_usage", "state_meta", "compression_locks")


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    return adapter_dump(path, TABLES)


def head(db: SessionDB) -> int:
    assert db._engine is not None
    return int(db._engine.log.head()[0])


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "hermes" / "state.db"


@pytest.mark.parametrize("source", [None, float("nan")])
def test_recreating_a_session_with_a_null_source_fails_like_hermes(path: Path, source: Any) -> None:
    """Hermes' insert-or-enrich binds ``source`` into ``sessions.source NOT NULL``; SQLite checks
    that constraint before the upsert's ON CONFLICT, so a None (or NaN, bound as NULL) source
    fails with IntegrityError also when the session exists. The facade used to return the id."""
    db = SessionDB(path)
    db.create_session("s1", "cli", model="gpt")
    before, rows = head(db), dump(path)
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL constraint failed: sessions.source"):
        db.create_session("s1", source, model="other")
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL constraint failed: sessions.source"):
        db.ensure_session("s1", source)
    assert head(db) == before and dump(path) == rows
    assert db.get_session("s1")["source"] == "cli"
    db.close()


def test_read_only_writes_that_break_a_constraint_fail_as_read_only_writes(path: Path) -> None:
    """Hermes' read-only connection refuses a write statement before SQLite checks any
    constraint, so such a call fails with OperationalError ('attempt to write a readonly
    database') whatever it carries; the facade raised the IntegrityError the write would meet
    (a new session without a source)."""
    db = SessionDB(path)
    db.create_session("s1", "cli")
    db.close()
    ro = SessionDB(path, read_only=True)
    try:
        for call in (lambda: ro.create_session("new", None), lambda: ro.ensure_session("s1", None)):  # type: ignore[arg-type]
            with pytest.raises(sqlite3.OperationalError, match="attempt to write a readonly database"):
                call()
        # What Hermes raises before it binds or steps still comes first.
        with pytest.raises(sqlite3.ProgrammingError):
            ro.create_session("new", ["not", "bindable"])  # type: ignore[arg-type]
    finally:
        ro.close()


def test_a_bind_with_an_unstorable_value_still_creates_the_topic_tables(path: Path) -> None:
    """Hermes' ``bind_telegram_topic`` runs the topic migration (its own committed write: the
    tables and their ``state_meta`` row) before it binds anything, so a managed_mode SQLite
    cannot bind fails the bind but leaves the tables. The facade checked the value first and
    created nothing: its rows and ``get_meta`` differed from Hermes' afterwards."""
    db = SessionDB(path)
    db.create_session("s1", "cli")
    with pytest.raises(OverflowError):
        db.bind_telegram_topic(chat_id="c", thread_id="t", user_id="u", session_key="k", session_id="s1",
                               managed_mode=2**63)  # type: ignore[arg-type]
    assert db.get_meta("telegram_dm_topic_schema_version") == "2"
    assert db.list_telegram_topic_bindings_for_chat(chat_id="c") == []
    assert db._engine is not None
    db._engine.rebuild()
    assert db.get_meta("telegram_dm_topic_schema_version") == "2"
    db.close()


def test_compression_lock_and_cooldown_values_sqlite_refuses_fail_softly_like_hermes(path: Path) -> None:
    """Hermes runs these calls' statements inside ``try: ... except sqlite3.Error`` (log a
    warning, answer False/None), so a holder or cooldown value sqlite3 cannot bind (a list, a
    dict: ProgrammingError) is logged and answered, not raised. The facade converted the values
    before its own guard and raised ProgrammingError. What is not an sqlite3.Error (an int over
    64 bits: OverflowError) is still raised, as Hermes raises it."""
    db = SessionDB(path)
    db.create_session("s1", "cli")
    before, rows = head(db), dump(path)
    assert db.try_acquire_compression_lock("s1", ["holder"]) is False  # type: ignore[arg-type]
    assert db.refresh_compression_lock("s1", {"holder": 1}) is False  # type: ignore[arg-type]
    assert db.record_compression_failure_cooldown("s1", [1.0]) is None  # type: ignore[arg-type]
    assert db.record_compression_failure_cooldown("s1", 1.0, error={"e": 1}) is None  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        db.try_acquire_compression_lock("s1", 2**63)  # type: ignore[arg-type]
    assert head(db) == before and dump(path) == rows
    assert db.get_compression_lock_holder("s1") is None and db.get_compression_failure_cooldown("s1") is None
    db.close()
    # On a read_only handle Hermes' first statement (a DELETE of an expired lock, which binds
    # only the id and the time) is refused before the holder is bound: False, whatever it is.
    ro = SessionDB(path, read_only=True)
    try:
        assert ro.try_acquire_compression_lock("s1", 2**63) is False  # type: ignore[arg-type]
        assert ro.try_acquire_compression_lock("s1", "h") is False
        with pytest.raises(OverflowError):  # the id is bound by that DELETE: its binding error comes first
            ro.try_acquire_compression_lock(2**63, "h")  # type: ignore[arg-type]
    finally:
        ro.close()


def test_usage_values_hermes_never_binds_are_not_refused(path: Path) -> None:
    """Hermes binds the billing route of ``update_token_counts`` only for a call that accounts
    usage, and ``record_auxiliary_usage`` binds ``model or 'unknown'``, ``provider or ''`` and
    ``float(cost or 0.0)``: an int over 64 bits as the provider of a call without usage, an
    empty list as a route key, a Decimal cost are accepted there. The facade converted every
    value first and raised OverflowError/ProgrammingError."""
    db = SessionDB(path)
    db.create_session("s1", "cli", model="gpt")
    db.update_token_counts("s1", billing_provider=2**63, billing_base_url=["x"], billing_mode={"m": 1})  # type: ignore[arg-type]
    db.record_auxiliary_usage("s1", "title", model=[], billing_provider=[], input_tokens=3,  # type: ignore[arg-type]
                              estimated_cost_usd=Decimal("0.25"))  # type: ignore[arg-type]
    rows = dump(path)
    assert [r[1:4] for r in rows["session_model_usage"]] == [(("str", "s1"), ("str", "unknown"), ("str", ""))]
    assert rows["session_model_usage"][0][13] == ("float", 0.25)
    assert db.get_session("s1")["billing_provider"] is None
    assert db._engine is not None
    db._engine.rebuild()
    assert dump(path) == rows
    db.close()


@pytest.mark.parametrize("call, error", [
    (lambda db: db.update_token_counts("new", input_tokens=1, estimated_cost_usd="abc"), ValueError),
    (lambda db: db.update_token_counts("new", input_tokens=1, billing_provider=2**63), OverflowError),
    (lambda db: db.update_token_counts("new", input_tokens=["x"]), sqlite3.ProgrammingError),
    (lambda db: db.record_auxiliary_usage("new", "title", input_tokens=1, estimated_cost_usd=["x"]), TypeError),
    (lambda db: db.record_auxiliary_usage("new", "title", billing_provider="p\ud800"), UnicodeEncodeError),
])
def test_a_usage_value_hermes_cannot_bind_fails_after_the_session_row(path: Path, call: Any, error: type) -> None:
    """Hermes' usage calls insert the session row in a write of their own, then bind the usage:
    a value that fails there leaves the new session row (and no usage). The facade refused
    before anything and left no row, so ``get_session`` and every list differed."""
    db = SessionDB(path)
    with pytest.raises(error):
        call(db)
    row = db.get_session("new")
    assert row is not None and row["source"] == "unknown" and row["input_tokens"] == 0
    assert dump(path)["session_model_usage"] == []
    db.close()


# ---- against the real class ---------------------------------------------------------------------

HOSTILE: list[Any] = [None, [], ["x"], 2**63, "s\ud800", b"b", Decimal("0.25"), "abc"]
USAGE = ([("update_token_counts", p) for p in ("model", "billing_provider", "billing_base_url", "billing_mode",
                                                "estimated_cost_usd", "actual_cost_usd", "cost_status", "input_tokens",
                                                "api_call_count")]
         + [("record_auxiliary_usage", p) for p in ("model", "billing_provider", "billing_base_url",
                                                   "estimated_cost_usd", "input_tokens")])
CASES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    (name, (sid, "title") if name == "record_auxiliary_usage" else (sid,), {**usage, param: value})
    for name, param in USAGE for value in HOSTILE for sid in ("new",)
    for usage in ({}, {"input_tokens": 5} if param != "input_tokens" else {"output_tokens": 1})
] + [
    ("create_session", ("s1", None), {}), ("ensure_session", ("s1", float("nan")), {}),
    ("bind_telegram_topic", (), {"chat_id": "c", "thread_id": "t", "user_id": "u", "session_key": "k",
                                 "session_id": "s1", "managed_mode": 2**63}),
    ("try_acquire_compression_lock", ("s1", ["h"]), {}), ("try_acquire_compression_lock", ("s1", 2**63), {}),
    ("refresh_compression_lock", ("s1", {"h": 1}), {}), ("record_compression_failure_cooldown", ("s1", [1.0]), {}),
]


def typed_rows(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {t: [tuple(("nan",) if isinstance(v, float) and math.isnan(v) else (type(v).__name__, v) for v in r)
                    for r in conn.execute(f"SELECT * FROM {t} ORDER BY rowid")]
                for t in (*TABLES, "telegram_dm_topic_mode", "telegram_dm_topic_bindings") if t in names}
    finally:
        conn.close()


def outcome(db: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return ("ok", getattr(db, name)(*args, **kwargs))
    except Exception as e:  # the exception's type is part of the contract
        return ("raised", type(e).__name__)


Call = tuple[str, tuple[Any, ...], dict[str, Any]]


class Pair:
    """Runs calls on a fresh pair of databases, Hermes' real class and the facade, both on one
    clock; each starts with session ``s1`` (source cli, model gpt)."""

    def __init__(self, tmp_path: Path, clock: Clock) -> None:
        assert hermes_state is not None
        self.real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
        self.tmp_path, self.clock, self.runs = tmp_path, clock, 0

    def differences(self, cases: list[list[Call]], read_only: bool = False, closed: bool = False,
                    rebuild: bool = False) -> list[Any]:
        """Per case (calls run in order on one pair): the cases whose results or exception types,
        or typed rows afterwards, differ. ``read_only``: the calls go to a handle opened
        read-only over the rows; ``closed``: to a handle already closed; ``rebuild``: the
        facade's rows must also be what a rebuild from its log alone makes."""
        found = []
        for calls in cases:
            self.runs += 1
            outcomes, rows = [], []
            for cls in (self.real, SessionDB):
                path = self.tmp_path / f"{self.runs}-{cls.__module__}" / "state.db"
                path.parent.mkdir()
                self.clock.now = 1_750_000_000.25
                db = cls(path)
                db.create_session("s1", "cli", model="gpt")
                if read_only:
                    db.close()
                    db = cls(path, read_only=True)
                if closed:
                    db.close()
                try:
                    outcomes.append([outcome(db, name, args, kwargs) for name, args, kwargs in calls])
                finally:
                    db.close()
                rows.append(typed_rows(path))
                if cls is SessionDB and rebuild:
                    with SessionDB(path) as again:
                        assert again._engine is not None
                        again._engine.rebuild()
                    rows.append(typed_rows(path))
            if outcomes[0] != outcomes[1] or any(r != rows[0] for r in rows[1:]):
                found.append((calls, outcomes, [r for r in rows[1:] if r != rows[0]][:1]))
        return found


    def each(self, calls: list[Call], read_only: bool = False, closed: bool = False) -> list[Any]:
        """Each call on one pair of handles that no call can change (``read_only`` or ``closed``),
        over ``s1`` (titled 'T', one message) and its untitled child: the calls whose result or
        exception type differ, and the rows if any call changed them."""
        assert read_only or closed
        handles, paths = [], []
        for cls in (self.real, SessionDB):
            self.runs += 1
            path = self.tmp_path / f"{self.runs}-{cls.__module__}" / "state.db"
            path.parent.mkdir()
            self.clock.now = 1_750_000_000.25
            db = cls(path)
            db.create_session("s1", "cli", model="gpt")
            db.append_message("s1", "user", "hello world")
            db.set_session_title("s1", "T")
            db.create_session("child", "cli", parent_session_id="s1")
            db.close()
            handles.append(cls(path, read_only=read_only))
            paths.append(path)
            if closed:
                handles[-1].close()
        found: list[Any] = []
        try:
            for name, args, kwargs in calls:
                outcomes = [outcome(db, name, args, kwargs) for db in handles]
                if outcomes[0] != outcomes[1]:
                    found.append(((name, args, kwargs), outcomes))
        finally:
            for db in handles:
                db.close()
        if typed_rows(paths[0]) != typed_rows(paths[1]):
            found.append("rows differ")
        return found


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pair:
    if hermes_state is None:
        pytest.skip("needs hermes_state (python3 run compat)")
    import importlib
    import pkgutil

    import eventlog.adapters.hermes as facade

    clock = Clock()
    monkeypatch.setattr(hermes_state, "time", clock)
    for info in pkgutil.iter_modules(facade.__path__):
        module = importlib.import_module(f"{facade.__name__}.{info.name}")
        if getattr(module, "time", None) is real_time:
            monkeypatch.setattr(module, "time", clock)
    return Pair(tmp_path, clock)


@pytest.mark.hermes
@pytest.mark.parametrize("read_only", [False, True])
def test_hostile_arguments_match_the_real_sessiondb(pair: Pair, read_only: bool) -> None:
    """Each case on a fresh pair of databases: the same result or exception type, the same rows
    afterwards (read_only: a sample of the cases, on a handle opened read-only over the rows)."""
    cases = [[case] for case in (CASES[::5] + CASES[-7:] if read_only else CASES)]
    assert pair.differences(cases, read_only=read_only) == []


NAN, INF = float("nan"), float("inf")


@pytest.mark.hermes
def test_usage_with_nan_and_infinite_values_matches_the_real_sessiondb(pair: Pair) -> None:
    """NaN and +/-inf in the usage calls' numbers, alone and added onto a stored row (inf + -inf
    is NaN, which SQLite stores as NULL), and as the session id: results, rows, and the rows a
    rebuild from the log makes. Hermes inserts the session row of a usage call in a write of its
    own, also for a NaN or None id (a row with a NULL id: SQLite lets a TEXT primary key be NULL),
    before the usage fails on ``session_model_usage.session_id``; the facade wrote no row."""
    numbers = ("input_tokens", "reasoning_tokens", "estimated_cost_usd")
    cases: list[list[Call]] = [
        [("record_auxiliary_usage", ("s1", "title"), {name: a}), ("record_auxiliary_usage", ("s1", "title"), {name: b})]
        for name in numbers for a in (NAN, INF, -INF, 2.0) for b in (NAN, INF, -INF)]
    cases += [[("update_token_counts", ("s1",), {"input_tokens": a}), ("update_token_counts", ("s1",), {"input_tokens": b})]
              for a in (INF, -INF) for b in (NAN, INF, -INF)]
    cases += [[("record_auxiliary_usage", (sid, "title"), usage)]
              for sid in (NAN, INF, "new") for usage in ({}, {"input_tokens": 2}, {"estimated_cost_usd": NAN})]
    cases += [[("update_token_counts", (sid,), usage)]
              for sid in (None, NAN, INF) for usage in ({}, {"input_tokens": 1}, {"actual_cost_usd": 1.0},
                                                      {"input_tokens": 1, "absolute": True})]
    assert pair.differences(cases, rebuild=True) == []


def test_list_sessions_rich_reads_its_queries_in_every_order(path: Path) -> None:
    """Hermes strips ``id_query``/``search_query`` before it looks at ``order_by_last_active``:
    a query that is not a string fails with AttributeError in either order. The facade read
    them only for the last-activity order and answered the full list otherwise."""
    db = SessionDB(path)
    db.create_session("s1", "cli")
    for kwargs in ({"id_query": 5}, {"search_query": ["s1"]}, {"id_query": 5, "order_by_last_active": True}):
        with pytest.raises(AttributeError):
            db.list_sessions_rich(**kwargs)
    assert [s["id"] for s in db.list_sessions_rich(id_query="  ", search_query="")] == ["s1"]
    assert [s["id"] for s in db.list_sessions_rich(id_query=b"zz", search_query=b"zz")] == ["s1"]  # bytes strip
    db.close()


def test_get_conversation_root_gives_back_an_id_without_parent_as_given(path: Path) -> None:
    """Hermes returns ``session_id`` itself when it has no recorded parent; the facade made it
    a string (``5`` came back as ``'5'``, bytes as their repr)."""
    db = SessionDB(path)
    db.create_session("root", "cli")
    db.create_session("child", "cli", parent_session_id="root")
    assert db.get_conversation_root("child") == "root"
    assert db.get_conversation_root(5) == 5  # type: ignore[arg-type]
    assert db.get_conversation_root(b"x") == b"x"  # type: ignore[arg-type]
    db.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_calls_on_a_closed_handle_raise_hermes_attribute_error(path: Path, read_only: bool) -> None:
    """Hermes' close() sets its connection to None, so a call after it fails at its first
    statement with AttributeError, which is no sqlite3.Error: its compression lock and cooldown
    calls (which swallow sqlite3.Error) raise it too, a read_only handle raises it rather than
    its read-only error, and a value sqlite3 could not bind is never bound. The facade raised
    sqlite3.ProgrammingError ('Cannot operate on a closed database'), which a caller's ``except
    sqlite3.Error`` swallowed where Hermes' error passed."""
    SessionDB(path).close()
    db = SessionDB(path, read_only=read_only)
    db.close()
    for call in (lambda: db.try_acquire_compression_lock("s1", "h"), lambda: db.refresh_compression_lock("s1", "h"),
                 lambda: db.release_compression_lock("s1", "h"), lambda: db.record_compression_failure_cooldown("s1", 1.0),
                 lambda: db.clear_compression_failure_cooldown("s1"), lambda: db.get_session("s1"),
                 lambda: db.append_message("s1", "user", "x"), lambda: db.create_session("s2", "cli"),
                 lambda: db.update_system_prompt("s1", "P"), lambda: db.set_meta("k", 2**63),
                 lambda: db.record_gateway_session_peer("s1", source="tg", session_key="k"),
                 lambda: db.replace_messages("s1", None), lambda: db.fail_handoff("s1", None),  # type: ignore[arg-type]
                 lambda: db.vacuum()):
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'execute'"):
            call()
    with pytest.raises(TypeError):  # Hermes hashes the id before its first read
        db.get_conversation_root(["s1"])  # type: ignore[arg-type]
    assert db.update_session_cwd("", "/tmp") is None  # calls Hermes returns from first still return
    assert db._conn is None


def test_a_read_only_handle_refuses_a_write_at_its_first_statement(path: Path) -> None:
    """Hermes' read-only connection refuses a call at its first write statement, after binding
    that statement's values and before the rest of the call runs. The facade looked at the
    messages or entries first (TypeError, AttributeError for ones that are not a list or a dict),
    bound every key of a delete (Hermes binds the first), and left the session id of
    ``record_gateway_session_peer`` unbound (Hermes binds it last, before the refusal)."""
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.set_session_title("s1", "T")
    ro = SessionDB(path, read_only=True)
    try:
        for call in (lambda: ro.replace_messages("s1", None), lambda: ro.archive_and_compact("s1", 5),  # type: ignore[arg-type]
                     lambda: ro.replace_messages("s1", "not a list"),  # type: ignore[arg-type]
                     lambda: ro.replace_gateway_routing_entries(5),  # type: ignore[arg-type]
                     lambda: ro.delete_gateway_routing_entries("s\ud800")):  # 's' first, refused before the surrogate
            with pytest.raises(sqlite3.OperationalError, match="attempt to write a readonly database"):
                call()
        with pytest.raises(OverflowError):
            ro.record_gateway_session_peer(2**63, source="tg", session_key="k")  # type: ignore[arg-type]
        with pytest.raises(OverflowError):
            ro.replace_messages(2**63, [])  # type: ignore[arg-type]
        with pytest.raises(UnicodeEncodeError):
            ro.delete_gateway_routing_entries(["s\ud800", "k"])
        # Hermes' only-if-empty title reads first: nothing to write, so nothing refused.
        assert ro.set_auto_title_if_empty("s1", "") is False and ro.set_auto_title_if_empty("missing", None) is False
        # Hermes' lock call swallows what sqlite3 refuses: False, as for the read-only refusal.
        assert ro.try_acquire_compression_lock(["s1"], "h") is False  # type: ignore[arg-type]
    finally:
        ro.close()


def test_a_read_only_handle_searches_where_hermes_answers_nothing(tmp_path: Path) -> None:
    """The one read the facade keeps apart from Hermes 0.19.0 (docs/HERMES.md, Reads): Hermes'
    read-only handle never sets its FTS flag and answers ``[]`` to every ``search_messages``;
    the facade's read-only handle finds what a writable one finds."""
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "hello world")
    with SessionDB(path, read_only=True) as ro:
        assert [m["session_id"] for m in ro.search_messages("hello")] == ["s1"]
    if hermes_state is not None:  # where Hermes is installed, check that it still differs so
        Real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
        other = tmp_path / "hermes.db"
        db = Real(other)
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "hello world")
        db.close()
        ro = Real(other, read_only=True)
        try:
            assert ro.search_messages("hello") == []
        finally:
            ro.close()


def test_update_system_prompt_on_a_read_only_handle_binds_the_id_first(path: Path) -> None:
    """Hermes binds the prompt and then the id of its UPDATE before the read-only connection
    refuses it: an id sqlite3 cannot bind raises its binding error, not OperationalError."""
    SessionDB(path).close()
    ro = SessionDB(path, read_only=True)
    try:
        with pytest.raises(OverflowError):
            ro.update_system_prompt(2**63, "P")  # type: ignore[arg-type]
        with pytest.raises(UnicodeEncodeError):
            ro.update_system_prompt("s\ud800", "P")
        with pytest.raises(sqlite3.ProgrammingError):
            ro.update_system_prompt(["s1"], "P")  # type: ignore[arg-type]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro.update_system_prompt("s1", "P")
    finally:
        ro.close()


# ---- closed and read-only handles, every public method ------------------------------------------

PUBLIC: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "create_session": (("s2", "cli"), {}), "ensure_session": (("s1",), {}),
    "record_gateway_session_peer": (("s1",), {"source": "telegram", "session_key": "k", "chat_id": "c"}),
    "set_expiry_finalized": (("s1",), {}), "save_gateway_routing_entry": (("k", "{}"), {}),
    "replace_gateway_routing_entries": (({"k": "{}"},), {}), "load_gateway_routing_entries": ((), {}),
    "delete_gateway_routing_entries": ((["k"],), {}), "list_gateway_sessions": ((), {}),
    "find_session_by_origin": ((), {"platform": "telegram", "chat_id": "c"}),
    "find_latest_gateway_session_for_peer": ((), {"source": "telegram", "session_key": "k"}),
    "end_session": (("s1", "done"), {}), "reopen_session": (("s1",), {}), "promote_to_session_reset": (("s1",), {}),
    "update_session_cwd": (("s1", "/tmp"), {}), "backfill_repo_roots": (({"/tmp": "/"},), {}),
    "record_compression_failure_cooldown": (("s1", 5.0), {}), "get_compression_failure_cooldown": (("s1",), {}),
    "clear_compression_failure_cooldown": (("s1",), {}), "get_compression_fallback_streak": (("s1",), {}),
    "set_compression_fallback_streak": (("s1", 2), {}), "refresh_compression_lock": (("s1", "h"), {}),
    "try_acquire_compression_lock": (("s1", "h"), {}), "release_compression_lock": (("s1", "h"), {}),
    "get_compression_lock_holder": (("s1",), {}), "update_session_meta": (("s1", "{}"), {}),
    "update_system_prompt": (("s1", "P"), {}), "update_session_model": (("s1", "m"), {}),
    "update_session_billing_route": (("s1",), {"provider": "p", "base_url": "u"}),
    "update_token_counts": (("s1", 3, 4), {}), "record_auxiliary_usage": (("s1", "title"), {"input_tokens": 3}),
    "prune_empty_ghost_sessions": ((), {}), "finalize_orphaned_compression_sessions": ((), {}),
    "get_session": (("s1",), {}), "resolve_session_id": (("s1",), {}), "set_session_title": (("s1", "T"), {}),
    "set_auto_title_if_empty": (("s1", "T"), {}), "get_session_title": (("s1",), {}),
    "set_session_archived": (("s1", True), {}), "get_session_by_title": (("T",), {}),
    "resolve_session_by_title": (("T",), {}), "get_next_title_in_lineage": (("T",), {}),
    "get_compression_tip": (("s1",), {}), "distinct_session_cwds": ((), {}), "list_sessions_rich": ((), {}),
    "list_cron_job_runs": (("j",), {}), "append_message": (("s1", "user", "hi"), {}),
    "replace_messages": (("s1", [{"role": "user", "content": "x"}]), {}), "has_archived_messages": (("s1",), {}),
    "archive_and_compact": (("s1", [{"role": "user", "content": "x"}]), {}),
    "set_latest_user_api_content": (("s1", "hi", "api"), {}), "get_messages": (("s1",), {}),
    "get_messages_around": (("s1", 1), {}), "get_anchored_view": (("s1", 1), {}),
    "resolve_resume_session_id": (("s1",), {}), "get_messages_as_conversation": (("s1",), {}),
    "get_resume_conversations": (("s1",), {}), "get_ancestor_display_prefix": (("s1",), {}),
    "get_conversation_root": (("s1",), {}), "rewind_to_message": (("s1", 1), {}), "restore_rewound": (("s1", 1), {}),
    "list_recent_user_messages": (("s1",), {}), "search_messages": (("hello",), {}),
    "search_sessions_by_id": (("s",), {}), "search_sessions": ((), {}), "session_count": ((), {}),
    "message_count": ((), {}), "has_platform_message_id": (("s1", "p"), {}), "get_compression_lineage": (("s1",), {}),
    "export_session": (("s1",), {}), "export_session_lineage": (("s1",), {}), "export_all": ((), {}),
    "import_sessions": (([{"id": "imp", "source": "cli", "messages": []}],), {}), "clear_messages": (("s1",), {}),
    "delete_session": (("s1",), {}), "delete_session_if_empty": (("s1",), {}), "delete_sessions": ((["s1"],), {}),
    "count_empty_sessions": ((), {}), "delete_empty_sessions": ((), {}),
    "list_prune_candidates": ((), {"older_than_days": 1}), "archive_sessions": ((), {"older_than_days": 1}),
    "prune_sessions": ((), {"older_than_days": 1}), "get_meta": (("k",), {}), "set_meta": (("k", "v"), {}),
    "apply_telegram_topic_migration": ((), {}), "enable_telegram_topic_mode": ((), {"chat_id": "c", "user_id": "u"}),
    "disable_telegram_topic_mode": ((), {"chat_id": "c"}),
    "is_telegram_topic_mode_enabled": ((), {"chat_id": "c", "user_id": "u"}),
    "get_telegram_topic_binding": ((), {"chat_id": "c", "thread_id": "t"}),
    "list_telegram_topic_bindings_for_chat": ((), {"chat_id": "c"}),
    "get_telegram_topic_binding_by_session": ((), {"session_id": "s1"}),
    "delete_telegram_topic_binding": ((), {"chat_id": "c", "thread_id": "t"}),
    "bind_telegram_topic": ((), {"chat_id": "c", "thread_id": "t", "user_id": "u", "session_key": "k",
                                 "session_id": "s1"}),
    "is_telegram_session_linked_to_topic": ((), {"session_id": "s1"}),
    "list_unlinked_telegram_sessions_for_user": ((), {"chat_id": "c", "user_id": "u"}),
    "optimize_fts": ((), {}), "rebuild_fts": ((), {}), "vacuum": ((), {}), "maybe_auto_prune_and_vacuum": ((), {}),
    "request_handoff": (("s1", "telegram"), {}), "get_handoff_state": (("s1",), {}),
    "list_pending_handoffs": ((), {}), "claim_handoff": (("s1",), {}), "complete_handoff": (("s1",), {}),
    "fail_handoff": (("s1", "err"), {}),
}
"""A plausible call of every public method of Hermes' SessionDB (but close and sanitize_title)."""

ODD: list[Any] = [None, [], ["x"], 2**63, NAN, "s\ud800", b"b", "", 5, {"a": 1}]


def with_odd_values(names: Any) -> list[Call]:
    """Each call of ``names`` as PUBLIC has it, and with each argument in turn replaced by each
    of ODD."""
    calls: list[Call] = []
    for name in names:
        args, kwargs = PUBLIC[name]
        calls.append((name, args, kwargs))
        calls += [(name, args[:i] + (v,) + args[i + 1:], kwargs) for i in range(len(args)) for v in ODD]
        calls += [(name, args, {**kwargs, key: v}) for key in kwargs for v in ODD]
    return calls


@pytest.mark.hermes
def test_the_call_table_covers_every_public_method() -> None:
    if hermes_state is None:
        pytest.skip("needs hermes_state (python3 run compat)")
    Real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    public = {n for n, v in vars(Real).items()
              if not n.startswith("_") and callable(v) and not isinstance(v, staticmethod)} - {"close"}
    assert public == set(PUBLIC)


@pytest.mark.hermes
@pytest.mark.parametrize("read_only", [False, True])
def test_a_closed_handle_fails_every_call_as_hermes_does(pair: Pair, read_only: bool) -> None:
    """Hermes' close() sets its connection to None: every call after it fails at its first
    statement with AttributeError, before binding any value, unless it returned or failed in
    Python first (an id that cannot be hashed: TypeError). The facade raised its own
    sqlite3.ProgrammingError ('Cannot operate on a closed database'), which a caller's ``except
    sqlite3.Error`` swallows where Hermes' error passes; a read_only handle answered the read-only
    error, and a value sqlite3 cannot bind its binding error. Left aside: ``search_messages`` on
    a read_only handle, which Hermes answers with [] whatever it is asked (docs/HERMES.md)."""
    names = [n for n in PUBLIC if not (read_only and n == "search_messages")]
    assert pair.each(with_odd_values(names), read_only=read_only, closed=True) == []


WRITES = [n for n in PUBLIC if n not in {
    "load_gateway_routing_entries", "list_gateway_sessions", "find_session_by_origin",
    "find_latest_gateway_session_for_peer", "get_compression_failure_cooldown", "get_compression_fallback_streak",
    "get_compression_lock_holder", "get_session", "resolve_session_id", "get_session_title", "get_session_by_title",
    "resolve_session_by_title", "get_next_title_in_lineage", "get_compression_tip", "distinct_session_cwds",
    "list_sessions_rich", "list_cron_job_runs", "has_archived_messages", "get_messages", "get_messages_around",
    "get_anchored_view", "resolve_resume_session_id", "get_messages_as_conversation", "get_resume_conversations",
    "get_ancestor_display_prefix", "get_conversation_root", "list_recent_user_messages", "search_messages",
    "search_sessions_by_id", "search_sessions", "session_count", "message_count", "has_platform_message_id",
    "get_compression_lineage", "export_session", "export_session_lineage", "export_all", "count_empty_sessions",
    "list_prune_candidates", "get_meta", "is_telegram_topic_mode_enabled", "get_telegram_topic_binding",
    "list_telegram_topic_bindings_for_chat", "get_telegram_topic_binding_by_session",
    "is_telegram_session_linked_to_topic", "list_unlinked_telegram_sessions_for_user", "get_handoff_state",
    "list_pending_handoffs"}]


@pytest.mark.hermes
def test_a_read_only_handle_refuses_odd_writes_as_hermes_does(pair: Pair) -> None:
    """Every write method on a read_only handle, with each argument in turn an odd value: the
    same result or exception type as Hermes' read-only connection gives. That connection refuses
    a call at its first write statement, after binding that statement's values and before what
    the call does next: ``replace_messages``/``archive_and_compact``/
    ``replace_gateway_routing_entries`` fail with OperationalError whatever their messages or
    entries are (the facade raised TypeError or AttributeError iterating them first),
    ``delete_gateway_routing_entries`` binds only its first key, and
    ``record_gateway_session_peer`` binds the session id (last) before the refusal;
    ``set_auto_title_if_empty`` with an empty title returns False for a session that has a title
    (or none), before any write statement (the facade ran its no-op UPDATE, which the read-only
    connection refused)."""
    assert pair.each(with_odd_values(WRITES), read_only=True) == []


class _Text(str):
    """A str subclass (as an enum.StrEnum member or a typed id is): sqlite3 binds its text."""


class _Conforms:
    def __conform__(self, protocol: Any) -> str:
        return "conformed"


def test_values_sqlite3_adapts_are_stored_as_what_it_binds(path: Path) -> None:
    """sqlite3 binds a datetime (the standard library's adapter: ISO text), a value of any type
    a program registered an adapter for, and one with ``__conform__`` as what they give, and a
    str subclass as its text. Hermes stored them so; the facade refused the first ones
    (ProgrammingError) and failed a str-subclass session id with eventlog's ValidationError
    (its stream id was not a str). Rows, and the rows a rebuild makes, hold the text."""
    when = datetime.datetime(2025, 1, 2, 3, 4, 5)
    db = SessionDB(path)
    db.create_session(_Text("s1"), "cli")
    db.set_meta("when", when)  # type: ignore[arg-type]
    db.set_meta("day", when.date())  # type: ignore[arg-type]
    db.set_meta("conformed", _Conforms())  # type: ignore[arg-type]
    db.append_message("s1", "user", "x", platform_message_id=when)  # type: ignore[arg-type]
    db.ensure_session(when)  # type: ignore[arg-type]
    db.append_message("2025-01-02 03:04:05", "user", "same session")
    # Hermes compares the stored holder with the given one: the text is not the datetime.
    assert db.try_acquire_compression_lock("s1", when) is False  # type: ignore[arg-type]
    assert db.get_compression_lock_holder("s1") == "2025-01-02 03:04:05"
    rows = dump(path)
    assert db.get_meta("when") == "2025-01-02 03:04:05" and db.get_meta("day") == "2025-01-02"
    assert db.get_meta("conformed") == "conformed"
    assert [type(s["id"]) for s in db.list_sessions_rich()] == [str, str]
    assert db.get_session("2025-01-02 03:04:05")["message_count"] == 1
    assert db.get_messages("s1")[0]["platform_message_id"] == "2025-01-02 03:04:05"
    assert db._engine is not None
    db._engine.rebuild()
    assert dump(path) == rows
    db.close()


@pytest.mark.hermes
def test_values_sqlite3_adapts_match_the_real_sessiondb(pair: Pair) -> None:
    when = datetime.datetime(2025, 1, 2, 3, 4, 5)
    cases: list[list[Call]] = [
        [("create_session", (_Text("sub"), "cli"), {}), ("append_message", ("sub", "user", "x"), {})],
        [("update_token_counts", (_Text("new"), 3, 4), {}), ("record_auxiliary_usage", (_Text("new"), "t"), {})],
        [("ensure_session", (when,), {}), ("append_message", (when, "user", "x"), {"platform_message_id": when})],
        [("set_meta", ("k", when), {}), ("set_meta", ("d", when.date()), {}), ("set_meta", ("c", _Conforms()), {})],
        [("try_acquire_compression_lock", ("s1", when), {}), ("try_acquire_compression_lock", ("s1", _Text("h")), {})],
        [("replace_messages", ("s1", [{"role": "user", "content": "x", "tool_name": when}]), {})],
    ]
    assert pair.differences(cases, rebuild=True) == []


def test_a_raw_statement_sqlite_cannot_compile_fails_with_its_own_error(path: Path) -> None:
    """A raw statement that is neither a read nor a write nor transaction control was refused as
    a schema change (UnsupportedRawWrite: 'raw schema changes are not supported') before SQLite
    saw it, also a typo ('SELEC 1') or a drop of a table that does not exist, where Hermes'
    connection raises SQLite's own OperationalError ('near "SELEC": syntax error', 'no such
    table'). It is compiled first now; a schema change SQLite accepts is still refused."""
    db = SessionDB(path)
    assert db._conn is not None
    for sql, message in (("SELEC 1", 'near "SELEC": syntax error'), ("DROP TABLE nope", "no such table: nope"),
                         ("CREATE TABLE sessions (x)", "table sessions already exists")):
        with pytest.raises(sqlite3.OperationalError, match=message) as caught:
            db._conn.execute(sql)
        assert type(caught.value) is sqlite3.OperationalError
        with pytest.raises(sqlite3.OperationalError, match=message):
            db._conn.executescript(sql + ";")
    with pytest.raises(UnsupportedRawWrite):
        db._conn.execute("ALTER TABLE sessions ADD COLUMN extra TEXT")
    db.close()


@pytest.mark.hermes
@pytest.mark.parametrize("name", sorted(RAW_CALLBACKS))
def test_raw_callback_transaction_control_as_hermes(tmp_path: Path, name: str) -> None:
    """The outcomes test_hermes_adapter.py expects of ``_execute_write`` callbacks that commit
    or roll back themselves are Hermes' own."""
    if hermes_state is None:
        pytest.skip("needs hermes_state (python3 run compat)")
    Real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    db = Real(tmp_path / "state.db")
    try:
        db.create_session("s1", "cli")
        result = db._execute_write(RAW_CALLBACKS[name])
        session = db.get_session("s1")
        assert (result, session["title"], session["model"]) == RAW_OUTCOMES[name]
    finally:
        db.close()
