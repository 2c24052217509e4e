"""Typed reads: every read method, on the store and on each read model behind it, refuses a
wrong parameter name, a missing parameter or a value of the wrong type with a ValidationError
naming the parameter (never TypeError or a bare ValueError), and reads nothing.
"""
from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any, Iterator

import pytest

from eventlog.errors import EventLogError, ValidationError
from eventlog.sessions.fold import Fold
from eventlog.sessions.store import FoldReadModel, SessionStore
from projections.queries import Reader
from projections.store_reads import ProjectionReadModel

READS = ("get_session", "list_sessions", "get_messages", "get_usage", "get_reactions", "search", "stats")

# (method, positional args, keyword args, the parameter the error must name)
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("get_session", (), {}, "session_id"),
    ("search", ("x",), {"role": "usr"}, "role"),  # a typo matched nothing, silently (an outside audit)
    ("get_session", (5,), {}, "session_id"),
    ("get_session", (None,), {}, "session_id"),
    ("get_session", (), {"id": "s1"}, "id"),
    ("get_session", ("s1", "s2"), {}, "arguments"),
    ("get_session", ("s1",), {"session_id": "s1"}, "session_id"),
    ("list_sessions", (), {"sourc": "x"}, "sourc"),
    ("list_sessions", ("cli",), {}, "arguments"),
    ("list_sessions", (), {"source": 3}, "source"),
    ("list_sessions", (), {"limit": "ten"}, "limit"),
    ("list_sessions", (), {"limit": math.nan}, "limit"),
    ("list_sessions", (), {"limit": math.inf}, "limit"),
    ("list_sessions", (), {"limit": 2.0}, "limit"),
    ("list_sessions", (), {"limit": -1}, "limit"),
    ("list_sessions", (), {"limit": True}, "limit"),
    ("list_sessions", (), {"offset": -1}, "offset"),
    ("list_sessions", (), {"offset": None}, "offset"),
    ("list_sessions", (), {"offset": False}, "offset"),
    ("list_sessions", (), {"archived": 1}, "archived"),
    ("list_sessions", (), {"pinned": "yes"}, "pinned"),
    ("list_sessions", (), {"hidden": 0}, "hidden"),
    ("list_sessions", (), {"children": None}, "children"),
    ("list_sessions", (), {"workspace": Path("/w")}, "workspace"),
    ("get_messages", (), {}, "session_id"),
    ("get_messages", (["s1"],), {}, "session_id"),
    ("get_messages", ("s1",), {"inactive": True}, "inactive"),
    ("get_messages", ("s1",), {"include_inactive": "yes"}, "include_inactive"),
    ("get_messages", ("s1",), {"include_inactive": 1}, "include_inactive"),
    ("get_messages", ("s1",), {"limit": 1.5}, "limit"),
    ("get_messages", ("s1",), {"limit": -3}, "limit"),
    ("get_messages", ("s1",), {"after": "3"}, "after"),
    ("get_messages", ("s1",), {"after": True}, "after"),
    ("get_messages", ("s1", True), {}, "arguments"),
    ("get_usage", (b"s1",), {}, "session_id"),
    ("get_usage", (), {"sid": "s1"}, "sid"),
    ("get_reactions", ("4",), {}, "message_id"),
    ("get_reactions", (True,), {}, "message_id"),
    ("get_reactions", (4.0,), {}, "message_id"),
    ("get_reactions", (None,), {}, "message_id"),
    ("get_reactions", (), {"message": 4}, "message"),
    ("search", (), {}, "query"),
    ("search", (None,), {}, "query"),
    ("search", (["hello"],), {}, "query"),
    ("search", ("hello",), {"limit": -1}, "limit"),
    ("search", ("hello",), {"limit": math.nan}, "limit"),
    ("search", ("hello",), {"limit": "5"}, "limit"),
    ("search", ("hello",), {"role": 3}, "role"),
    ("search", ("hello",), {"session": "s1"}, "session"),
    ("search", ("hello",), {"session_id": 7}, "session_id"),
    ("search", ("hello", "user"), {}, "arguments"),
    ("stats", (), {"verbose": True}, "verbose"),
    ("stats", (1,), {}, "arguments"),
]

GOOD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("get_session", ("s1",), {}), ("get_session", (), {"session_id": "\ud800"}),
    ("list_sessions", (), {"limit": 0}), ("list_sessions", (), {"limit": None, "offset": 2**70}),
    ("list_sessions", (), {"archived": None, "pinned": None, "hidden": None, "children": False, "source": "cli",
                           "workspace": "/w"}),
    ("get_messages", ("s1",), {"after": -5}), ("get_messages", ("s1",), {"after": 2**70, "limit": 2**70}),
    ("get_messages", (), {"session_id": "s1", "include_inactive": True, "limit": None, "after": None}),
    ("get_usage", ("nope",), {}), ("get_reactions", (2**70,), {}), ("get_reactions", (-1,), {}),
    ("search", ("\ud800 hello",), {"limit": None}), ("search", ("",), {"role": "user", "source": "cli", "session_id": "s1"}),
    ("stats", (), {}),
]


@pytest.fixture(scope="module", params=["fold", "projection"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionStore]:
    home = tmp_path_factory.mktemp(f"reads-{request.param}")
    with SessionStore.open(home=home, profile="p", read_model=request.param, durability="nosync") as s:
        s.create_session("s1", source="cli", cwd="/w")
        mid = s.append_message("s1", "user", "hello there")
        s.react(mid, "ann", "+1")
        s.record_usage("s1", model="m", input_tokens=3)
        yield s


def models(store: SessionStore) -> list[tuple[str, Any]]:
    """The store and every read model implementation behind it."""
    reads = store._reads
    out: list[tuple[str, Any]] = [("SessionStore", store), (type(reads).__name__, reads)]
    if isinstance(reads, FoldReadModel):
        out.append(("Fold", reads._fold))
    else:
        assert isinstance(reads, ProjectionReadModel)
        out.append(("Reader", reads.reader))
    return out


@pytest.mark.parametrize("method, args, kwargs, field", BAD_CALLS,
                         ids=[f"{m}-{f}-{i}" for i, (m, _, _, f) in enumerate(BAD_CALLS)])
def test_a_bad_read_call_names_the_parameter(store: SessionStore, method: str, args: tuple[Any, ...],
                                             kwargs: dict[str, Any], field: str) -> None:
    head = store.log.head()
    for name, model in models(store):
        with pytest.raises(ValidationError) as info:
            getattr(model, method)(*args, **dict(kwargs))
        assert info.value.field == field, f"{name}.{method}: {info.value}"
        assert isinstance(info.value, EventLogError) and field in str(info.value)
    assert store.log.head() == head


def test_an_unknown_parameter_is_refused_with_the_list_of_parameters(store: SessionStore) -> None:
    with pytest.raises(ValidationError) as info:
        store.list_sessions(sourc="x")
    assert "not a parameter of SessionStore.list_sessions" in str(info.value)
    assert info.value.hint is not None and "source" in info.value.hint and "offset" in info.value.hint


@pytest.mark.parametrize("method, args, kwargs", GOOD_CALLS)
def test_good_read_calls_answer_alike_on_every_layer(store: SessionStore, method: str, args: tuple[Any, ...],
                                                     kwargs: dict[str, Any]) -> None:
    answers = []
    for name, model in models(store):
        found = getattr(model, method)(*args, **dict(kwargs))
        if isinstance(model, Fold) and method == "search":  # the fold lists messages; the rest wrap them
            found = [m["id"] for m in found]
        elif method == "search":
            found = [r["message_id"] for r in found["results"]]
        answers.append(found)
    assert all(a == answers[0] for a in answers), answers


def test_every_read_has_the_same_explicit_signature_everywhere() -> None:
    """The store, both read-model wrappers and both implementations take the same named
    parameters with the same defaults, and each read is checked (typed_read)."""
    for method in READS:
        reference = inspect.signature(getattr(SessionStore, method))
        for cls in (FoldReadModel, ProjectionReadModel, Fold, Reader):
            fn = getattr(cls, method)
            assert hasattr(fn, "__wrapped__"), f"{cls.__name__}.{method} is not wrapped by typed_read"
            got = inspect.signature(fn)
            assert list(got.parameters.values()) == list(reference.parameters.values()), \
                f"{cls.__name__}.{method}{got} differs from SessionStore.{method}{reference}"
        assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in reference.parameters.values())


def test_the_roles_a_read_takes_are_the_catalogues() -> None:
    from eventlog.sessions.events import ROLES
    from eventlog.sessions.reads import CLOSED_SETS

    assert set(CLOSED_SETS["role"]) == ROLES


def test_search_in_an_empty_session_id_is_refused(store: SessionStore) -> None:
    """`search x --session ""` answered nothing with exit 0 where every other use of the id refuses
    it (found by an outside audit)."""
    with pytest.raises(ValidationError) as info:
        store.search("x", session_id="")
    assert info.value.field == "session_id"
