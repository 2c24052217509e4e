"""Hostile arguments for every SessionStore write method.

Each call must either succeed, with its effect visible in the reads, or raise an
``EventLogError`` subclass and leave the log byte-for-byte unchanged. After every example the
read side (list_sessions, search, stats, get_messages, ...) must still answer.

Every example starts from a fresh profile with a small fixed history, so the session and
message ids below are known in advance (message ids are the seqs of their events).
"""
from __future__ import annotations

import collections
import json
import reprlib
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from eventlog.errors import EventLogError
from eventlog.sessions import events
from eventlog.sessions.store import SessionStore

READ_MODELS = ["fold", "projection"]

# Budget: a share of the loaded profile per write method, the whole profile for mixed sequences.
PROFILE_EXAMPLES = settings().max_examples
PER_METHOD = settings(max_examples=max(15, PROFILE_EXAMPLES // 5), deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SEQUENCES = settings(max_examples=max(30, PROFILE_EXAMPLES), deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- the fixed starting history -------------------------------------------------------------

ROOT, CHILD, GONE, UNKNOWN = "s-root", "s-child", "s-gone", "s-unknown"
M_ROOT_1, M_ROOT_2, M_CHILD, M_GONE = 4, 5, 6, 7
NOT_A_MESSAGE, NO_SUCH_MESSAGE = 1, 999_999
SIDS = [ROOT, CHILD, GONE, UNKNOWN]
MIDS = [M_ROOT_1, M_ROOT_2, M_CHILD, M_GONE, NOT_A_MESSAGE, NO_SUCH_MESSAGE]


def seed(store: SessionStore) -> None:
    store.create_session(id=ROOT, title="Base title", cwd="/work/app", git_branch="main", source="cli")
    store.create_session(id=CHILD, parent_session_id=ROOT)
    store.create_session(id=GONE, title="Gone title")
    assert store.append_message(ROOT, "user", "hello there") == M_ROOT_1
    assert store.append_message(ROOT, "assistant", "hi", tool_calls=[{"id": "c1"}]) == M_ROOT_2
    assert store.append_message(CHILD, "user", "child says") == M_CHILD
    assert store.append_message(GONE, "user", "soon deleted") == M_GONE
    store.react(M_ROOT_1, "ann", "👍")
    store.delete_session(GONE)


def log_bytes(store: SessionStore) -> tuple[Any, list[bytes]]:
    return store.log.head(), [bytes(v) for _, v in store.log.read(raw=True)]


# ---- hostile values ----------------------------------------------------------------------------

MB = 1 << 20


def _nested_list(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _nested_dict(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


_cyclic: list[Any] = []
_cyclic.append(_cyclic)


class StrSub(str):
    def __str__(self) -> str:  # a subclass that lies about itself
        return "lie"


class IntSub(int):
    pass


surrogate_text = st.text(st.characters(codec=None, categories=["Cs"]) | st.characters(), min_size=1, max_size=8)

hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**90) | st.integers(max_value=-(2**63) - 1, min_value=-(2**90)),
    st.floats(),
    st.sampled_from([1e30, float("nan"), -1.0, float("-inf"), float("inf"), 4.2e9 + 1, -0.0, 1e-300]),
    st.sampled_from(["", "   ", "\t\n", "\x00", "\ud800", "a\udfffb", "\udbff\udfff", "1700000000",
                     "2024-01-01T00:00:00Z", "2024-13-45", "yesterday", "NaN", "null", "[1, 2]",
                     '{"a": 1}', '{"a": NaN}', "not json {", "x" * 200, "é" * 1025,
                     "[" * 5000 + "]" * 5000, '{"k": ' * 70 + "1" + "}" * 70, '"\\ud800"', "[1e999]"]),
    st.just("x" * MB), st.just("\ud800" * 1024 + "y" * MB),
    surrogate_text,
    st.binary(max_size=8), st.just(bytearray(b"raw")), st.just(memoryview(b"mv")),
    st.lists(st.integers(), max_size=3), st.tuples(st.text(max_size=3)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.sampled_from([{1: "int key"}, {None: 1}, {"\ud800": 1, "\ufffd": 2}, {"k": float("nan")},  # noqa: F601 (distinct keys)
                     {"k": b"bytes"}, {"k": object()}, [object()], {"k": 2**64}, frozenset({1})]),
    st.sampled_from([_nested_list(100), _nested_dict(100), _nested_list(64), _cyclic, _nested_list(2000)]),
    st.sampled_from([object(), StrSub("s-root"), IntSub(4), 3 + 4j]),
    st.sampled_from(["s-unknown", "../../etc/passwd", "a" * 129, "has space", "s-root\n", "S-ROOT"]),
)


def mix(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly valid values, often hostile ones (a flatmap, so one_of does not flatten the weights)."""
    return st.integers(0, 2).flatmap(lambda i: hostile if i == 0 else valid)


def clean(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return valid


short = st.text(max_size=12)
name = st.sampled_from(["ann", "bob", "cli", "m1"]) | st.text(min_size=1, max_size=8)
session_id = st.sampled_from([ROOT, ROOT, CHILD, CHILD, GONE, UNKNOWN])
message_id = st.sampled_from([M_ROOT_1, M_ROOT_1, M_ROOT_2, M_CHILD, M_GONE, NOT_A_MESSAGE, NO_SUCH_MESSAGE])
when = st.one_of(st.floats(0, 4.2e9), st.integers(0, 4_200_000_000),
                 st.sampled_from(["2024-05-01T12:00:00Z", "2024-05-01", "2024-05-01T12:00:00+02:00", "1970-01-01"]))
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                        st.floats(allow_nan=False, allow_infinity=False), short)
json_object = st.dictionaries(short, json_scalar | st.lists(json_scalar, max_size=3), max_size=4)
json_list = st.lists(json_scalar | json_object, max_size=4)
as_json_text = st.builds(json.dumps, json_object)
tool_calls = st.lists(st.fixed_dictionaries({"id": short, "type": st.just("function"),
                                             "function": st.fixed_dictionaries({"name": short, "arguments": short})}),
                      max_size=3)
content = st.one_of(st.none(), st.text(max_size=40), json_list, json_object, st.just("y" * MB),
                    st.just([{"type": "text", "text": "multi"}, {"type": "image_url", "image_url": {"url": "u"}}]))
title = (st.sampled_from(["Base title", "Gone title", "New title", "  New   title ", "New title #2"])
         | st.text(max_size=30))
provenance = st.sampled_from(["derived", "llm", "user"])
version = st.none() | st.none() | st.integers(0, 14)


def fields(mx: Any, **options: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments: each documented field optional, through ``mx`` (mix or clean); a dirty
    call may also carry an unknown field name."""
    optional = {k: mx(v) for k, v in options.items()}
    if mx is mix:
        optional["bogus_field"] = hostile
    return st.fixed_dictionaries({}, optional=optional)


MESSAGE_FIELDS = dict(
    tool_calls=tool_calls | st.builds(json.dumps, tool_calls), tool_name=short, tool_call_id=short,
    reasoning=st.text(max_size=20), reasoning_details=json_list | json_object, token_count=st.integers(0, 10**6),
    finish_reason=short, display_kind=short, display_metadata=json_object | as_json_text, timestamp=when,
)
SESSION_FIELDS = dict(
    source=name, model=short, model_config=json_object | as_json_text,
    cwd=st.sampled_from(["/work/app", "/tmp"]) | short,
    git_repo_root=short, git_branch=short, parent_session_id=session_id, user_id=short | st.integers(0, 10**12),
    chat_id=short | st.integers(-(10**12), 10**12), chat_type=short, thread_id=short | st.integers(0, 99),
    title=title, title_source=provenance, started_at=when,
)
USAGE_FIELDS = dict(
    model=short, provider=short, task=short, input_tokens=st.integers(0, 10**7), output_tokens=st.integers(0, 10**7),
    cache_read_tokens=st.integers(0, 10**7), cache_write_tokens=st.integers(0, 10**7),
    reasoning_tokens=st.integers(0, 10**7), estimated_cost_usd=st.none() | st.floats(0, 100) | st.integers(0, 5),
    actual_cost_usd=st.none() | st.floats(0, 100), message_id=message_id,
)
META_FIELDS = dict(
    model=short, model_config=json_object | as_json_text, cwd=short, git_repo_root=short, git_branch=short,
    tool_names=st.lists(short, max_size=4), source=name,
)

def message_dict(mx: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"role": mx(st.sampled_from(sorted(events.ROLES)))},
                                 optional={"content": mx(content), **{k: mx(v) for k, v in MESSAGE_FIELDS.items()}})


class Call:
    """One write-method call; its repr keeps 1 MB arguments short in failure reports."""

    def __init__(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
        self.method, self.args, self.kwargs = method, args, kwargs or {}

    def __repr__(self) -> str:
        r = reprlib.Repr()
        r.maxstring = r.maxother = 60
        r.maxlevel = 4
        shown = [r.repr(a) for a in self.args] + [f"{k}={r.repr(v)}" for k, v in self.kwargs.items()]
        return f"{self.method}({', '.join(shown)})"


def call(method: str, *args: st.SearchStrategy[Any], kwargs: st.SearchStrategy[dict[str, Any]] | None = None
         ) -> st.SearchStrategy[Call]:
    return st.builds(lambda a, k: Call(method, a, k), st.tuples(*args), kwargs if kwargs is not None else st.just({}))


def calls_through(mx: Any) -> dict[str, st.SearchStrategy[Call]]:
    """One call strategy per write method, every argument drawn through ``mx``."""
    roles = st.sampled_from(sorted(events.ROLES))
    batch = st.lists(message_dict(mx) if mx is clean else st.one_of(message_dict(mx), hostile), max_size=4)
    return {
        "create_session": call("create_session", kwargs=fields(
            mx, id=st.none() | st.sampled_from([ROOT, GONE, "fresh-1", "fresh-2"]), **SESSION_FIELDS)),
        "append_message": call("append_message", mx(session_id), mx(roles), mx(content),
                               kwargs=fields(mx, **MESSAGE_FIELDS)),
        "append_messages": call("append_messages", mx(session_id), mx(batch)),
        "set_title": call("set_title", mx(session_id), mx(title), mx(provenance)),
        **{m: call(m, mx(session_id)) for m in ("archive", "unarchive", "pin", "unpin", "hide", "unhide", "reopen",
                                                "take_unseen_reactions")},
        "react": call("react", mx(message_id), mx(name), mx(st.sampled_from(["👍", "👎", "🎉"]) | name)),
        "remove_reaction": call("remove_reaction", mx(message_id), mx(name)),
        "record_usage": call("record_usage", mx(session_id), kwargs=fields(mx, **USAGE_FIELDS)),
        "update_meta": call("update_meta", mx(session_id), kwargs=fields(mx, **META_FIELDS)),
        "end_session": call("end_session", mx(session_id), mx(name)),
        "rewind": call("rewind", mx(session_id), mx(message_id), mx(version)),
        "delete_session": call("delete_session", mx(session_id), mx(version)),
    }


_CLEAN, _DIRTY = calls_through(clean), calls_through(mix)
# A third of the calls are well-formed (so successes and their effects get checked), the rest
# carry hostile arguments.
CALLS: dict[str, st.SearchStrategy[Call]] = {
    m: st.integers(0, 2).flatmap(lambda i, m=m: _CLEAN[m] if i == 0 else _DIRTY[m]) for m in _CLEAN}


# ---- what a success must look like in the reads ---------------------------------------------------

def _row(store: SessionStore, sid: str) -> dict[str, Any]:
    row = store.get_session(sid)
    assert row is not None, f"{sid} should be live after a successful call"
    return row


def _message(store: SessionStore, sid: str, mid: int) -> dict[str, Any]:
    found = [m for m in store.get_messages(sid, include_inactive=True) if m["id"] == mid]
    assert len(found) == 1, f"message {mid} should be readable in {sid}"
    return found[0]


def _check_message(store: SessionStore, sid: str, mid: int, given: dict[str, Any]) -> None:
    expected = events.validate("message.appended", {k: v for k, v in given.items() if v is not None}, sid)
    msg = _message(store, sid, mid)
    assert msg["active"] is True and msg["session_id"] == sid
    for key in ("role", "content", "tool_calls", "tool_name", "tool_call_id", "reasoning", "reasoning_details",
                "token_count", "finish_reason", "display_kind", "display_metadata", "timestamp"):
        if key in expected:
            assert msg[key] == expected[key], key


def _pre(store: SessionStore, c: Call) -> dict[str, Any]:
    """What a checker needs to know from before the call."""
    pre: dict[str, Any] = {}
    first = c.args[0] if c.args else None
    if c.method in ("react", "remove_reaction") and type(first) is int:
        pre["reactions"] = {r["author"]: r["emoji"] for r in store.get_reactions(first)}
    if isinstance(first, str):
        row = store.get_session(first)
        pre["row"] = row
        pre["usage_records"] = sum(u["records"] for u in store.get_usage(first)) if row else 0
    return pre


def check_success(store: SessionStore, c: Call, result: Any, pre: dict[str, Any], grew: bool) -> None:
    m, a, kw = c.method, c.args, c.kwargs
    if m == "create_session":
        sid = result
        assert isinstance(sid, str) and kw.get("id") in (None, sid) and grew
        row = _row(store, sid)
        expected = events.validate("session.created", {k: v for k, v in kw.items() if v is not None and k != "id"},
                                   sid)
        for key in ("source", "model", "model_config", "cwd", "git_repo_root", "git_branch", "parent_session_id",
                    "user_id", "chat_id", "chat_type", "thread_id", "title", "title_source", "started_at"):
            if expected.get(key) is not None:
                assert row[key] == expected[key], key
    elif m == "append_message":
        assert type(result) is int and grew
        _check_message(store, a[0], result, {**kw, "role": a[1], "content": a[2]})
    elif m == "append_messages":
        assert isinstance(result, list) and len(result) == len(a[1]) and grew == bool(result)
        for mid, given in zip(result, a[1]):
            _check_message(store, a[0], mid, given)
    elif m == "set_title":
        expected = events.validate("session.titled", {"title": a[1], "source": a[2]}, a[0])
        row = _row(store, a[0])
        if result is None:
            assert not grew
            assert events.TITLE_RANK[row["title_source"]] > events.TITLE_RANK[expected["source"]]
        else:
            assert grew and (row["title"], row["title_source"]) == (expected["title"], expected["source"])
    elif m in ("archive", "unarchive", "pin", "unpin", "hide", "unhide"):
        flag = {"archive": "archived", "pin": "pinned", "hide": "hidden"}[m.removeprefix("un")]
        assert grew and _row(store, a[0])[flag] is (not m.startswith("un"))
    elif m == "reopen":
        row = _row(store, a[0])
        assert grew and (row["end_reason"], row["ended_at"]) == (None, None)
    elif m == "take_unseen_reactions":
        assert isinstance(result, list) and grew == bool(result)
        assert all(r["seen"] is False for r in result)
        assert store.take_unseen_reactions(a[0]) == []
    elif m in ("react", "remove_reaction"):
        assert grew
        author = events.clean_text(a[1])
        now = {r["author"]: r["emoji"] for r in store.get_reactions(a[0])}
        if m == "remove_reaction" or pre["reactions"].get(author) == events.clean_text(a[2]):
            assert author not in now
        else:
            assert now.get(author) == events.clean_text(a[2])
    elif m == "record_usage":
        assert grew
        data = {k: v for k, v in kw.items() if v is not None or k.endswith("cost_usd")}
        expected = events.validate("usage.recorded", data, a[0])
        row, before = _row(store, a[0]), pre["row"]
        for token in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
            assert row[token] == before[token] + expected[token], token
        assert sum(u["records"] for u in store.get_usage(a[0])) == pre["usage_records"] + 1
        key = (expected.get("model"), expected.get("provider"), expected.get("task"))
        assert key in {(u["model"], u["provider"], u["task"]) for u in store.get_usage(a[0])}
    elif m == "update_meta":
        assert grew
        expected = events.validate("session.meta_updated", kw, a[0])
        row = _row(store, a[0])
        for key, value in expected.items():
            assert row[key] == value, key
    elif m == "end_session":
        row = _row(store, a[0])
        if result is None:
            assert not grew and pre["row"]["end_reason"] is not None
        else:
            assert grew and row["end_reason"] == events.clean_text(a[1]) and row["ended_at"] is not None
    elif m == "rewind":
        assert grew
        msgs = store.get_messages(a[0], include_inactive=True)
        assert any(x["id"] == a[1] for x in msgs)
        assert all(not x["active"] for x in msgs if x["id"] >= a[1])
    elif m == "delete_session":
        assert grew and store.get_session(a[0]) is None
    else:  # pragma: no cover
        raise AssertionError(f"no checker for {m}")


def reads_survive(store: SessionStore) -> None:
    """Every read answers whatever the writes before did."""
    for kw in ({}, {"archived": None, "hidden": None, "limit": None}, {"children": False, "workspace": "/work/app"},
               {"pinned": True, "source": "cli"}):
        for row in store.list_sessions(**kw):
            assert isinstance(row["id"], str)
    for query in ("hello", "x", "title multi", '"quoted" OR', "\ud800", ""):
        store.search(query)
    store.search("y", role="user", limit=5)
    stats = store.stats()
    assert stats["sessions"] >= 0 and stats["messages"] >= 0
    for sid in SIDS:
        store.get_session(sid)
        store.get_messages(sid, include_inactive=True)
        store.get_messages(sid, limit=1, after=M_ROOT_1)
        store.get_usage(sid)
    for mid in MIDS:
        store.get_reactions(mid)


OUTCOMES: collections.Counter[str] = collections.Counter()


def _note(outcome: str) -> None:
    OUTCOMES[outcome] += 1
    if currently_in_test_context():
        event(outcome)


def run_calls(read_model: str, calls: list[Call]) -> None:
    with tempfile.TemporaryDirectory() as home, SessionStore.open(
            home=home, profile="p", read_model=read_model, durability="nosync") as store:
        seed(store)
        for c in calls:
            pre = _pre(store, c)
            before = log_bytes(store)
            try:
                result = getattr(store, c.method)(*c.args, **c.kwargs)
            except EventLogError as e:
                _note(f"{c.method}: {type(e).__name__}")
                assert log_bytes(store) == before, f"{c!r} raised {e!r} but changed the log"
                continue
            _note(f"{c.method}: ok")
            check_success(store, c, result, pre, grew=store.log.head()[0] > before[0][0])
        reads_survive(store)
        assert store.log.verify().ok


@pytest.mark.parametrize("method", sorted(CALLS))
def test_each_write_method_survives_hostile_arguments(method: str) -> None:
    @PER_METHOD
    @given(st.lists(CALLS[method], min_size=1, max_size=3))
    def check(calls: list[Call]) -> None:
        run_calls("fold", calls)

    check()


@pytest.mark.parametrize("read_model", READ_MODELS)
def test_mixed_sequences_of_hostile_writes(read_model: str) -> None:
    @SEQUENCES
    @given(st.lists(st.one_of(*CALLS.values()), min_size=1, max_size=6))
    def check(calls: list[Call]) -> None:
        run_calls(read_model, calls)

    check()


def test_non_iterable_message_batches_are_refused() -> None:
    """A batch that is not a list of dicts is a ValidationError naming ``messages``, never a TypeError."""
    run_calls("fold", [Call("append_messages", (ROOT, bad)) for bad in (5, None, 1.5, object(), b"x")])
    with tempfile.TemporaryDirectory() as home, SessionStore.open(home=home, profile="p", read_model="fold",
                                                                  durability="nosync") as store:
        seed(store)
        for bad in (5, None, object()):
            with pytest.raises(EventLogError) as err:
                store.append_messages(ROOT, bad)  # type: ignore[arg-type]
            assert getattr(err.value, "field", "").startswith("messages")



class _LyingInt(int):
    def __int__(self) -> int:
        return 2**70


class _AnyStr(str):
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("user")


class _BigFloat(float):
    def __float__(self) -> float:
        return 1e300

    def __le__(self, other: object) -> bool:
        return True


def test_subclasses_are_judged_by_the_values_they_store() -> None:
    """A str, int or float subclass is checked as the value that will be stored, never as what
    its own methods make of it: an int whose ``__int__`` lied passed the range check and then
    failed to encode (a raw TypeError), a str equal to everything stored the role 'wizard'
    (outside audit, helper-40)."""
    with tempfile.TemporaryDirectory() as home, SessionStore.open(home=home, profile="p", read_model="fold",
                                                                  durability="nosync") as store:
        seed(store)
        mid = store.append_message(ROOT, "user", "x", token_count=_LyingInt(5))
        assert store.log.get(mid)["data"]["token_count"] == 5
        before = store.log.head()
        with pytest.raises(EventLogError) as err:
            store.append_message(ROOT, _AnyStr("wizard"), "x")
        assert getattr(err.value, "field", "").endswith("role")
        with pytest.raises(EventLogError) as err:
            store.set_title(ROOT, "A title", source=_AnyStr("bogus"))
        assert getattr(err.value, "field", "").endswith("source")
        assert store.log.head() == before
        seq = store.record_usage(ROOT, model="m", estimated_cost_usd=_BigFloat(0.5))
        assert store.log.get(seq)["data"]["estimated_cost_usd"] == 0.5
        assert store.log.verify().ok
