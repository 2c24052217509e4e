"""SessionStore: one test per domain rule, through the public write and read API.

Every test runs against the reference fold, and also against the SQLite projection once
``projections.store_reads`` exists (the parameter list is built at import time).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.errors import (
    ConcurrencyError,
    ConflictError,
    EventLogError,
    NotFoundError,
    TitleConflictError,
    ValidationError,
)
from eventlog.sessions import events
from eventlog.sessions.fold import MESSAGE_KEYS, SESSION_KEYS, Fold
from eventlog.sessions.store import FoldReadModel, SessionStore

REPO = Path(__file__).resolve().parent.parent


READ_MODELS = ["fold", "projection"]


@pytest.fixture(params=READ_MODELS)
def read_model(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(tmp_path: Path, read_model: str) -> Iterator[SessionStore]:
    with SessionStore.open(home=tmp_path, profile="p", read_model=read_model, durability="nosync") as s:
        yield s


def snapshot(store: SessionStore) -> tuple[Any, list[bytes]]:
    return store.log.head(), [bytes(v) for _, v in store.log.read(raw=True)]


@contextmanager
def log_unchanged(store: SessionStore) -> Iterator[None]:
    """The body must leave the log byte-for-byte as it found it."""
    before = snapshot(store)
    yield
    assert snapshot(store) == before


def session(store: SessionStore, sid: str) -> dict[str, Any]:
    row = store.get_session(sid)
    assert row is not None, f"session {sid} should be live"
    return row


def hits(store: SessionStore, query: str, **kw: Any) -> list[dict[str, Any]]:
    """Search results as rows carrying ``message_id`` and ``session_id``."""
    out = store.search(query, **kw)
    rows = out["results"] if isinstance(out, dict) else out
    return [dict(r, message_id=r.get("message_id", r.get("id"))) for r in rows]


def found(store: SessionStore, query: str, **kw: Any) -> set[int]:
    return {r["message_id"] for r in hits(store, query, **kw)}


def active_ids(store: SessionStore, sid: str) -> list[int]:
    return [m["id"] for m in store.get_messages(sid)]


# ---- titles ----------------------------------------------------------------------------------


def test_titles_are_unique_in_a_profile(store: SessionStore, tmp_path: Path) -> None:
    a = store.create_session(title="Release plan")
    b = store.create_session()
    with log_unchanged(store), pytest.raises(TitleConflictError) as err:
        store.set_title(b, "Release plan")
    assert err.value.holder == a and err.value.field == "title"
    with log_unchanged(store), pytest.raises(TitleConflictError):
        store.set_title(b, "  Release \t plan ")  # compared after normalization
    with log_unchanged(store), pytest.raises(TitleConflictError):
        store.create_session(title="Release plan")
    assert session(store, b)["title"] is None
    # The holder may set its own title again; once it moves on, the old title is free.
    assert store.set_title(a, "Release plan") is not None
    store.set_title(a, "Release plan (old)")
    store.set_title(b, "Release plan")
    assert session(store, b)["title"] == "Release plan"
    # Another profile is another namespace.
    with SessionStore.open(home=tmp_path, profile="q", read_model="fold", durability="nosync") as other:
        c = other.create_session(title="Release plan")
        assert other.get_session(c)["title"] == "Release plan"  # type: ignore[index]
        assert other.get_session(b) is None


def test_title_provenance_lower_never_replaces_higher(store: SessionStore) -> None:
    sid = store.create_session()
    assert store.set_title(sid, "derived one", "derived") is not None
    assert store.set_title(sid, "llm one", "llm") is not None
    assert (session(store, sid)["title"], session(store, sid)["title_source"]) == ("llm one", "llm")
    with log_unchanged(store):
        assert store.set_title(sid, "derived two", "derived") is None
    assert store.set_title(sid, "user one") is not None  # source defaults to "user"
    with log_unchanged(store):
        assert store.set_title(sid, "llm two", "llm") is None
        assert store.set_title(sid, "derived three", "derived") is None
    assert store.set_title(sid, "user two", "user") is not None  # equal rank replaces
    row = session(store, sid)
    assert (row["title"], row["title_source"]) == ("user two", "user")
    # A title given at creation has a provenance too.
    s2 = store.create_session(title="auto", title_source="derived")
    assert store.set_title(s2, "better", "llm") is not None
    assert session(store, s2)["title"] == "better"


def test_next_title_numbers_a_lineage(store: SessionStore) -> None:
    assert store.next_title("Fix the parser") == "Fix the parser"
    root = store.create_session(title="Fix the parser")
    assert store.next_title("Fix the parser") == "Fix the parser #2"
    child = store.create_session(parent_session_id=root, title=store.next_title("Fix the parser"))
    assert session(store, child)["title"] == "Fix the parser #2"
    assert store.next_title("Fix the parser #2") == "Fix the parser #3"
    assert store.next_title("Fix the parser") == "Fix the parser #3"
    store.delete_session(child)
    assert store.next_title("Fix the parser") == "Fix the parser #2"  # freed by the delete


def test_next_title_takes_a_lone_also_taken_string_as_one_title(store: SessionStore) -> None:
    # also_taken="Twin" was iterated as the titles "T", "w", "i", "n": 'Twin' came back as free
    assert store.next_title("Twin", also_taken="Twin") == "Twin #2"
    assert store.next_title("Twin", also_taken=["Twin", "Twin #2"]) == "Twin #3"


# ---- lineage ---------------------------------------------------------------------------------


def test_child_inherits_cwd_and_git_fields_unless_given(store: SessionStore) -> None:
    root = store.create_session(cwd="/src/app", git_repo_root="/src", git_branch="main", model="m1")
    child = store.create_session(parent_session_id=root)
    row = session(store, child)
    assert (row["cwd"], row["git_repo_root"], row["git_branch"]) == ("/src/app", "/src", "main")
    assert row["parent_session_id"] == root
    assert row["model"] is None  # only cwd and git fields are inherited
    own = store.create_session(parent_session_id=root, cwd="/elsewhere", git_branch="topic")
    row = session(store, own)
    assert (row["cwd"], row["git_repo_root"], row["git_branch"]) == ("/elsewhere", "/src", "topic")
    grandchild = store.create_session(parent_session_id=own)
    row = session(store, grandchild)
    assert (row["cwd"], row["git_repo_root"], row["git_branch"]) == ("/elsewhere", "/src", "topic")


def test_append_events_refuses_references_to_messages_that_are_not_there(store: SessionStore) -> None:
    """As react() and rewind() do: the message a reaction or rewind names must be a message of
    the event's session, and a new session's parent must be live (an outside audit appended
    such events through the generic entry point)."""
    a, b = store.create_session("a"), store.create_session("b")
    mid = store.append_message(a, "user", "hi")
    bad = [{"type": "message.reaction_set", "session": a, "data": {"message_id": 999999, "author": "x", "emoji": "+1"}},
           {"type": "message.reaction_set", "session": b, "data": {"message_id": mid, "author": "x", "emoji": "+1"}},
           {"type": "message.reaction_removed", "session": a, "data": {"message_id": 1, "author": "x"}},
           {"type": "messages.rewound", "session": b, "data": {"message_id": mid}},
           {"type": "session.created", "session": "c", "data": {"parent_session_id": "nope"}}]
    for e in bad:
        with log_unchanged(store), pytest.raises(NotFoundError):
            store.append_events([e])
    with log_unchanged(store), pytest.raises(NotFoundError):  # a good event first: nothing of the batch
        store.append_events([{"type": "session.pinned", "session": a, "data": {}}, bad[0]])
    store.append_events([{"type": "message.reaction_set", "session": a,
                          "data": {"message_id": mid, "author": "x", "emoji": "+1"}},
                         {"type": "session.created", "session": "c", "data": {"parent_session_id": a}},
                         {"type": "session.created", "session": "d", "data": {"parent_session_id": "c"}}])
    assert [(r["author"], r["emoji"]) for r in store.get_reactions(mid)] == [("x", "+1")]
    assert session(store, "d")["parent_session_id"] == "c"


def test_append_events_judges_a_batch_in_its_order(store: SessionStore) -> None:
    """A session.created for an id ever used, and anything after the deletion of its session or
    of an ancestor earlier in the same batch, are refused as the store's methods refuse them
    (an outside audit appended all of these through append_events; one left a live orphan)."""
    p = store.create_session("p")
    c = store.create_session("c", parent_session_id=p)
    mid = store.append_message(c, "user", "hi")
    erased = store.create_session("e")
    store.erase_session(erased, "test")

    def deleted(sid: str) -> dict[str, Any]:
        return {"type": "session.deleted", "session": sid, "data": {}}

    def message(sid: str) -> dict[str, Any]:
        return {"type": "message.appended", "session": sid, "data": {"role": "user", "content": "x"}}

    bad: list[tuple[list[dict[str, Any]], type[Exception]]] = [
        ([{"type": "session.created", "session": erased, "data": {}}], ConflictError),
        ([{"type": "session.created", "session": p, "data": {}}], ConflictError),
        ([{"type": "session.created", "session": "n", "data": {}}, {"type": "session.created", "session": "n",
                                                                      "data": {}}], ConflictError),
        ([deleted(c), message(c)], NotFoundError),
        ([deleted(p), message(c)], NotFoundError),
        ([deleted(p), {"type": "message.reaction_set", "session": c,
                       "data": {"message_id": mid, "author": "x", "emoji": "+1"}}], NotFoundError),
        ([deleted(p), {"type": "session.created", "session": "k", "data": {"parent_session_id": p}}], NotFoundError),
        ([deleted(p), {"type": "session.created", "session": "k", "data": {"parent_session_id": c}}], NotFoundError),
    ]
    for batch, error in bad:
        with log_unchanged(store), pytest.raises(error):
            store.append_events(batch)
    assert store.append_events([message(c), deleted(p)])  # in that order it is fine
    assert store.get_session(c) is None and store.get_session(p) is None


def test_child_of_unknown_parent_is_refused(store: SessionStore) -> None:
    with log_unchanged(store), pytest.raises(NotFoundError):
        store.create_session(parent_session_id="no-such-parent")


@pytest.mark.parametrize("flag,on,off", [("archived", "archive", "unarchive"),
                                         ("pinned", "pin", "unpin"),
                                         ("hidden", "hide", "unhide")])
def test_flags_apply_to_the_whole_lineage(store: SessionStore, flag: str, on: str, off: str) -> None:
    root = store.create_session()
    child = store.create_session(parent_session_id=root)
    grandchild = store.create_session(parent_session_id=child)
    stranger = store.create_session()
    family = [root, child, grandchild]

    getattr(store, on)(grandchild)
    assert [session(store, s)[flag] for s in family] == [True, True, True]
    assert session(store, stranger)[flag] is False
    late = store.create_session(parent_session_id=root)  # copies the root's flags
    assert session(store, late)[flag] is True

    getattr(store, off)(child)
    assert [session(store, s)[flag] for s in [*family, late]] == [False] * 4
    getattr(store, on)(root)
    assert [session(store, s)[flag] for s in [*family, late]] == [True] * 4


def test_hidden_lineage_leaves_listings_and_search(store: SessionStore) -> None:
    root = store.create_session()
    child = store.create_session(parent_session_id=root)
    store.append_message(child, "user", "zebra crossing")
    other = store.create_session()
    store.append_message(other, "user", "zebra stripes")
    store.hide(root)
    assert {s["id"] for s in store.list_sessions(limit=None)} == {other}
    assert {s["id"] for s in store.list_sessions(hidden=True, limit=None)} == {root, child}
    assert {r["session_id"] for r in hits(store, "zebra")} == {other}


def test_archived_lineage_leaves_default_listing_and_pinned_always_listed(store: SessionStore) -> None:
    root = store.create_session()
    child = store.create_session(parent_session_id=root)
    store.archive(child)
    assert store.list_sessions(limit=None) == []
    assert {s["id"] for s in store.list_sessions(archived=True, limit=None)} == {root, child}
    store.unarchive(root)
    store.pin(root)
    extra = [store.create_session() for _ in range(3)]
    # The page holds the most recent session; the pinned lineage is appended after it.
    assert [s["id"] for s in store.list_sessions(limit=1)] == [extra[-1], child, root]


# ---- reactions -------------------------------------------------------------------------------


def test_reactions_one_per_author_same_retracts_other_replaces(store: SessionStore) -> None:
    sid = store.create_session()
    mid = store.append_message(sid, "assistant", "done")

    def current() -> dict[str, str]:
        return {r["author"]: r["emoji"] for r in store.get_reactions(mid)}

    store.react(mid, "ann", "👍")
    store.react(mid, "bob", "🎉")
    assert current() == {"ann": "👍", "bob": "🎉"}
    store.react(mid, "ann", "👎")  # a different emoji replaces
    assert current() == {"ann": "👎", "bob": "🎉"}
    store.react(mid, "ann", "👎")  # the same emoji again retracts
    assert current() == {"bob": "🎉"}
    store.react(mid, "ann", "👎")
    assert current() == {"ann": "👎", "bob": "🎉"}
    assert [r["author"] for r in store.get_reactions(mid)] == ["ann", "bob"]


def test_reactions_on_unknown_messages_are_refused(store: SessionStore) -> None:
    sid = store.create_session()
    store.append_message(sid, "user", "x")
    with log_unchanged(store), pytest.raises(NotFoundError):
        store.react(10_000, "ann", "👍")
    with log_unchanged(store), pytest.raises(NotFoundError):
        store.react(1, "ann", "👍")  # seq 1 is the session.created event, not a message


def test_unseen_reactions_are_taken_exactly_once(store: SessionStore) -> None:
    sid = store.create_session()
    m1 = store.append_message(sid, "assistant", "one")
    m2 = store.append_message(sid, "assistant", "two")
    assert store.take_unseen_reactions(sid) == []
    r1 = store.react(m1, "ann", "👍")
    r2 = store.react(m2, "bob", "👀")
    store.react(m2, "cat", "x")
    store.react(m2, "cat", "x")  # retracted before anyone looked: never taken
    taken = store.take_unseen_reactions(sid)
    assert [(r["message_id"], r["author"], r["emoji"], r["set_seq"]) for r in taken] == [
        (m1, "ann", "👍", r1), (m2, "bob", "👀", r2)]
    with log_unchanged(store):
        assert store.take_unseen_reactions(sid) == []
    r3 = store.react(m1, "ann", "❤")  # a replacement is new, so unseen again
    assert [(r["author"], r["emoji"], r["set_seq"]) for r in store.take_unseen_reactions(sid)] == [
        ("ann", "❤", r3)]
    assert store.take_unseen_reactions(sid) == []
    # Seen reactions are still reactions.
    assert {r["author"]: r["seen"] for r in store.get_reactions(m1)} == {"ann": True}


def _react_many(store: SessionStore, sid: str, mids: list[int], n: int, pause_every: int = 0) -> list[int]:
    seqs = []
    for i in range(n):
        seqs.append(store.react(mids[i % len(mids)], f"author{i}", "👍"))
        if pause_every and i % pause_every == 0:
            time.sleep(0.002)
    return seqs


def test_take_unseen_reactions_exactly_once_across_threads(store: SessionStore) -> None:
    sid = store.create_session()
    mids = [store.append_message(sid, "assistant", f"m{i}") for i in range(4)]
    stop = threading.Event()
    taken: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def taker(slot: int) -> None:
        try:
            while True:
                done = stop.is_set()
                got = store.take_unseen_reactions(sid)
                taken[slot] += [r["set_seq"] for r in got]
                if done and not got:
                    return
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    made = _react_many(store, sid, mids, 120, pause_every=7)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors
    together = taken[0] + taken[1]
    assert sorted(together) == sorted(made)  # every reaction once, none twice


_TAKER = r"""
import json, sys, time
from eventlog.sessions.store import SessionStore
home, sid = sys.argv[1], sys.argv[2]
taken = []
with SessionStore.open(home=home, profile="p", read_model="fold", durability="nosync") as s:
    print("ready", flush=True)
    while True:
        done = s.get_session(sid)["end_reason"] is not None
        got = s.take_unseen_reactions(sid)
        taken += [r["set_seq"] for r in got]
        if done and not got:
            break
        if not got:
            time.sleep(0.001)
print(json.dumps(taken), flush=True)
"""


def test_take_unseen_reactions_exactly_once_across_processes(store: SessionStore) -> None:
    sid = store.create_session()
    mids = [store.append_message(sid, "assistant", f"m{i}") for i in range(4)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", _TAKER, str(store.home), sid], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        made = _react_many(store, sid, mids, 150, pause_every=5)
        store.end_session(sid, "done")
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    per_proc = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    together = [seq for t in per_proc for seq in t]
    assert sorted(together) == sorted(made)


_RULED = r"""
import json, sys
from eventlog.errors import TitleConflictError
from eventlog.sessions.store import SessionStore
home, read_model = sys.argv[1], sys.argv[2]
with SessionStore.open(home=home, profile="p", read_model=read_model, durability="nosync") as s:
    print("ready", flush=True)
    for line in sys.stdin:
        op, sid, arg = json.loads(line)
        try:
            if op == "title":
                out = s.set_title(sid, arg)
            elif op == "llm-title":
                out = s.set_title(sid, arg, source="llm")
            elif op == "create":
                out = s.create_session(title=arg)
            else:
                out = s.end_session(sid, arg)
            print(json.dumps(["ok", out]), flush=True)
        except TitleConflictError:
            print(json.dumps(["conflict", None]), flush=True)
"""


def test_domain_rules_hold_between_processes_racing_for_them(store: SessionStore) -> None:
    """A title held by one live session, the first end reason, title provenance: two processes
    sent the same kind of call at the same moment never both get a seq where only one write can
    take effect — the other is told (TitleConflictError, or None) — and a later caller in another
    process sees the earlier one's write however fresh its own read model is."""
    kind = "fold" if isinstance(store._reads, FoldReadModel) else "projection"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", _RULED, str(store.home), kind], cwd=REPO, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]

    def both(calls: list[list[Any]]) -> list[list[Any]]:
        for p, call in zip(procs, calls):
            assert p.stdin is not None
            p.stdin.write(json.dumps(call) + "\n")
        for p in procs:
            assert p.stdin is not None
            p.stdin.flush()
        return [json.loads(p.stdout.readline()) for p in procs if p.stdout is not None]

    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr
        for r in range(8):
            a, b = store.create_session(), store.create_session()
            got = both([["title", a, f"Report {r}"], ["title", b, f"Report {r}"]])
            assert sorted(k for k, _ in got) == ["conflict", "ok"], got
            assert [store.get_session(x)["title"] for x in (a, b)].count(f"Report {r}") == 1
            got = both([["create", None, f"New {r}"], ["create", None, f"New {r}"]])
            assert sorted(k for k, _ in got) == ["conflict", "ok"], got
            c = store.create_session()
            got = both([["end", c, "first"], ["end", c, "second"]])
            assert sorted(v is None for _, v in got) == [False, True], got  # one seq, one None
            d = store.create_session()
            (first,) = both([["title", d, f"Mine {r}"], ["end", d, "x"]])[:1]
            assert first[0] == "ok"
            # after that user title returned, an llm title from the other process is outranked
            assert both([["end", d, "again"], ["llm-title", d, f"Llm {r}"]]) == [["ok", None], ["ok", None]]
            assert store.get_session(d)["title"] == f"Mine {r}"
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_a_stopped_process_holding_the_rules_lock_delays_a_rule_check_by_the_lock_timeout_only(
        tmp_path: Path) -> None:
    """The rules lock never waits forever: a holder that is stopped (SIGSTOP) costs another
    process's set_title/end_session at most its lock timeout, then WriterBusyError names it."""
    import signal

    from eventlog.errors import WriterBusyError
    from eventlog.sessions.store import RULES_LOCK

    with SessionStore.open(tmp_path, "p", follower=False, lock_timeout=0.5) as store:
        sid = store.create_session()
        lock = tmp_path / "profiles" / "p" / RULES_LOCK
        holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                                   f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
                                   "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            holder.send_signal(signal.SIGSTOP)
            for call in (lambda: store.set_title(sid, "T"), lambda: store.end_session(sid, "r")):
                t0 = time.monotonic()
                with pytest.raises(WriterBusyError) as info:
                    call()
                assert time.monotonic() - t0 < 5 and info.value.pid == holder.pid
                assert "kill -CONT" in (info.value.hint or "")
            assert store.get_session(sid)["title"] is None and store.get_session(sid)["end_reason"] is None
        finally:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
            holder.wait(10)
        assert store.set_title(sid, "T") is not None  # free again


# ---- rewind ----------------------------------------------------------------------------------


def test_rewind_hides_the_message_and_everything_after_it(store: SessionStore) -> None:
    sid = store.create_session()
    other = store.create_session()
    mids = [store.append_message(sid, "user", f"turn {i}", tool_calls=[{"id": str(i)}]) for i in range(5)]
    elsewhere = store.append_message(other, "user", "untouched")
    store.rewind(sid, mids[2])
    assert active_ids(store, sid) == mids[:2]
    every = store.get_messages(sid, include_inactive=True)
    assert [(m["id"], m["active"]) for m in every] == [(m, i < 2) for i, m in enumerate(mids)]
    row = session(store, sid)
    assert (row["message_count"], row["tool_call_count"]) == (2, 2)
    assert active_ids(store, other) == [elsewhere]
    # The log keeps every message and the rewind itself.
    kinds = [e["type"] for e in store.log.read_session(sid)]
    assert kinds.count("message.appended") == 5 and kinds[-1] == "messages.rewound"
    # New messages after a rewind are active; search sees only active ones.
    later = store.append_message(sid, "user", "turn again")
    assert active_ids(store, sid) == [*mids[:2], later]
    assert found(store, "turn") == {*mids[:2], later}


def test_rewind_needs_a_message_of_that_session(store: SessionStore) -> None:
    a = store.create_session()
    b = store.create_session()
    mine = store.append_message(a, "user", "a")
    theirs = store.append_message(b, "user", "b")
    with log_unchanged(store), pytest.raises(NotFoundError):
        store.rewind(a, theirs)
    with log_unchanged(store), pytest.raises(NotFoundError):
        store.rewind(a, 999_999)
    with log_unchanged(store), pytest.raises(NotFoundError):
        store.rewind("ghost", mine)
    assert active_ids(store, a) == [mine]


# ---- end / reopen ----------------------------------------------------------------------------


def test_end_first_reason_wins_and_reopen_clears(store: SessionStore) -> None:
    sid = store.create_session()
    assert store.end_session(sid, "user_exit") is not None
    with log_unchanged(store):
        assert store.end_session(sid, "timeout") is None
    row = session(store, sid)
    assert row["end_reason"] == "user_exit" and row["ended_at"] is not None
    store.reopen(sid)
    row = session(store, sid)
    assert (row["end_reason"], row["ended_at"]) == (None, None)
    assert store.end_session(sid, "compressed") is not None
    assert session(store, sid)["end_reason"] == "compressed"


# ---- usage -----------------------------------------------------------------------------------


def test_usage_sums_per_session_and_per_model_provider_task(store: SessionStore) -> None:
    sid = store.create_session()
    store.record_usage(sid, model="m1", provider="acme", task="chat", input_tokens=10, output_tokens=5)
    store.record_usage(sid, model="m1", provider="acme", task="chat", input_tokens=1, cache_read_tokens=7,
                       estimated_cost_usd=0.5)
    store.record_usage(sid, model="m2", input_tokens=100, reasoning_tokens=3, actual_cost_usd=2)
    store.record_usage(sid, model="m1", provider="acme", task="title", output_tokens=4,
                       estimated_cost_usd=None)
    row = session(store, sid)
    assert (row["input_tokens"], row["output_tokens"], row["cache_read_tokens"], row["cache_write_tokens"],
            row["reasoning_tokens"]) == (111, 9, 7, 0, 3)
    assert (row["estimated_cost_usd"], row["actual_cost_usd"]) == (0.5, 2.0)
    rows = {(u["model"], u["provider"], u["task"]): u for u in store.get_usage(sid)}
    assert list(rows) == [("m1", "acme", "chat"), ("m1", "acme", "title"), ("m2", None, None)]
    chat = rows[("m1", "acme", "chat")]
    assert (chat["records"], chat["input_tokens"], chat["output_tokens"], chat["cache_read_tokens"]) == (2, 11, 5, 7)
    assert (chat["estimated_cost_usd"], chat["actual_cost_usd"]) == (0.5, None)
    title = rows[("m1", "acme", "title")]
    assert (title["records"], title["estimated_cost_usd"], title["actual_cost_usd"]) == (1, None, None)
    assert rows[("m2", None, None)]["actual_cost_usd"] == 2.0


def test_missing_cost_stays_missing(store: SessionStore) -> None:
    sid = store.create_session()
    store.record_usage(sid, input_tokens=5)
    store.record_usage(sid, output_tokens=5, estimated_cost_usd=None, actual_cost_usd=None)
    row = session(store, sid)
    assert (row["estimated_cost_usd"], row["actual_cost_usd"]) == (None, None)
    assert store.stats()["estimated_cost_usd"] is None
    store.record_usage(sid, estimated_cost_usd=0)
    assert session(store, sid)["estimated_cost_usd"] == 0.0  # a known zero is not missing
    assert session(store, sid)["actual_cost_usd"] is None


# ---- delete ----------------------------------------------------------------------------------


def test_delete_is_a_tombstone_that_cascades_to_descendants(store: SessionStore) -> None:
    root = store.create_session(title="root")
    child = store.create_session(parent_session_id=root, title="child")
    grandchild = store.create_session(parent_session_id=child, title="grandchild")
    sibling = store.create_session(parent_session_id=root, title="sibling")
    msgs = {s: store.append_message(s, "user", f"needle {s}") for s in (root, child, grandchild, sibling)}
    for s in (child, grandchild):
        store.record_usage(s, input_tokens=10)
    store.react(msgs[grandchild], "ann", "👍")
    before = store.stats()

    store.delete_session(child)
    for gone in (child, grandchild):
        assert store.get_session(gone) is None
        assert store.get_messages(gone, include_inactive=True) == []
        assert store.get_usage(gone) == []
    assert store.get_reactions(msgs[grandchild]) == []
    assert {s["id"] for s in store.list_sessions(limit=None)} == {root, sibling}
    assert found(store, "needle") == {msgs[root], msgs[sibling]}
    assert (before["sessions"], before["messages"]) == (1, 1)  # children never count in stats
    assert (store.stats()["sessions"], store.stats()["messages"]) == (1, 1)
    # The titles are free again; the ids are not.
    for title in ("child", "grandchild"):
        store.create_session(title=title)
    with log_unchanged(store), pytest.raises(ConflictError):
        store.create_session(id=grandchild)
    # The log keeps everything: a tombstone, not an erasure.
    assert [e["type"] for e in store.log.read_session(child)][-1] == "session.deleted"
    assert any(e["type"] == "message.appended" for e in store.log.read_session(grandchild))
    # Deleting the root takes the rest of the lineage.
    store.delete_session(root)
    assert store.get_session(sibling) is None
    assert found(store, "needle") == set()


# ---- unknown targets, conflicts, ids ----------------------------------------------------------

_ON_SESSION: list[tuple[str, Callable[[SessionStore, str], Any]]] = [
    ("append_message", lambda s, sid: s.append_message(sid, "user", "hi")),
    ("append_messages", lambda s, sid: s.append_messages(sid, [{"role": "user", "content": "hi"}])),
    ("set_title", lambda s, sid: s.set_title(sid, "a title")),
    ("archive", lambda s, sid: s.archive(sid)),
    ("unarchive", lambda s, sid: s.unarchive(sid)),
    ("pin", lambda s, sid: s.pin(sid)),
    ("unpin", lambda s, sid: s.unpin(sid)),
    ("hide", lambda s, sid: s.hide(sid)),
    ("unhide", lambda s, sid: s.unhide(sid)),
    ("take_unseen_reactions", lambda s, sid: s.take_unseen_reactions(sid)),
    ("record_usage", lambda s, sid: s.record_usage(sid, input_tokens=1)),
    ("update_meta", lambda s, sid: s.update_meta(sid, model="m")),
    ("end_session", lambda s, sid: s.end_session(sid, "bye")),
    ("reopen", lambda s, sid: s.reopen(sid)),
    ("rewind", lambda s, sid: s.rewind(sid, 2)),
    ("delete_session", lambda s, sid: s.delete_session(sid)),
    ("create_session(parent)", lambda s, sid: s.create_session(parent_session_id=sid)),
]


@pytest.mark.parametrize("name,op", _ON_SESSION, ids=[n for n, _ in _ON_SESSION])
@pytest.mark.parametrize("target", ["unknown", "deleted"])
def test_operations_on_unknown_sessions_raise_not_found(store: SessionStore, name: str,
                                                         op: Callable[[SessionStore, str], Any], target: str) -> None:
    sid = "never-created"
    if target == "deleted":
        sid = store.create_session()
        store.append_message(sid, "user", "m")
        store.delete_session(sid)
    with log_unchanged(store), pytest.raises(NotFoundError):
        op(store, sid)


@pytest.mark.parametrize("target", ["unknown", "deleted"])
def test_operations_on_unknown_messages_raise_not_found(store: SessionStore, target: str) -> None:
    live = store.create_session()
    store.append_message(live, "user", "m")
    mid = 424_242
    if target == "deleted":
        gone = store.create_session()
        mid = store.append_message(gone, "user", "m")
        store.delete_session(gone)
    for op in (lambda: store.react(mid, "ann", "👍"), lambda: store.remove_reaction(mid, "ann"),
               lambda: store.rewind(live, mid)):
        with log_unchanged(store), pytest.raises(NotFoundError):
            op()


def test_create_session_with_a_used_id_conflicts(store: SessionStore) -> None:
    assert store.create_session(id="fixed-id", title="first") == "fixed-id"
    with log_unchanged(store), pytest.raises(ConflictError) as err:
        store.create_session(id="fixed-id")
    assert err.value.field == "id"
    store.delete_session("fixed-id")
    with log_unchanged(store), pytest.raises(ConflictError):
        store.create_session(id="fixed-id")  # a deleted id stays used


def test_generated_ids_sort_in_creation_order(store: SessionStore, tmp_path: Path, read_model: str) -> None:
    made = [store.create_session() for _ in range(200)]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert all(events.validate_session_id(s) == s for s in made)
    store.close()
    with SessionStore.open(home=tmp_path, profile="p", read_model=read_model, durability="nosync") as again:
        later = again.create_session()
    assert later > made[-1]


# ---- batches and optimistic concurrency --------------------------------------------------------


def test_append_messages_is_one_atomic_batch(store: SessionStore) -> None:
    sid = store.create_session()
    good = {"role": "user", "content": "fine"}
    with log_unchanged(store), pytest.raises(ValidationError) as err:
        store.append_messages(sid, [good, {"role": "robot", "content": "x"}, good])
    assert err.value.field.startswith("messages[1].") and err.value.field.endswith("role")
    with log_unchanged(store), pytest.raises(ValidationError) as err:
        store.append_messages(sid, [good, good, {"role": "user", "content": b"raw bytes"}])
    assert err.value.field.startswith("messages[2].") and err.value.field.endswith("content")
    with log_unchanged(store), pytest.raises(ValidationError) as err:
        store.append_messages(sid, [good, "not a message"])  # type: ignore[list-item]
    assert err.value.field == "messages[1]"
    assert store.get_messages(sid) == []
    ids = store.append_messages(sid, [{"role": "user", "content": f"m{i}"} for i in range(5)])
    assert ids == sorted(ids) and active_ids(store, sid) == ids
    assert [m["content"] for m in store.get_messages(sid)] == [f"m{i}" for i in range(5)]
    assert store.append_messages(sid, []) == []


def test_rewind_and_delete_with_a_stale_version_are_refused(store: SessionStore) -> None:
    sid = store.create_session()
    first = store.append_message(sid, "user", "one")
    seen = store.version(sid)
    store.append_message(sid, "assistant", "two")  # someone else moved on
    with log_unchanged(store), pytest.raises(ConcurrencyError):
        store.rewind(sid, first, expected_version=seen)
    with log_unchanged(store), pytest.raises(ConcurrencyError):
        store.delete_session(sid, expected_version=seen)
    assert len(active_ids(store, sid)) == 2
    store.rewind(sid, first, expected_version=store.version(sid))
    assert active_ids(store, sid) == []
    store.delete_session(sid, expected_version=store.version(sid))
    assert store.get_session(sid) is None


# ---- threads, read-your-writes, upcasting -------------------------------------------------------


def test_threads_sharing_one_store_keep_every_message_in_order(store: SessionStore) -> None:
    sessions = [store.create_session() for _ in range(8)]
    errors: list[BaseException] = []
    per_thread = 40

    def work(t: int) -> None:
        try:
            for i in range(per_thread):
                if i % 10 == 9:
                    store.append_messages(sessions[t], [{"role": "user", "content": f"{t}:{i}"}])
                else:
                    store.append_message(sessions[t], "user", f"{t}:{i}")
                if i % 13 == 0:
                    store.get_messages(sessions[t])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    for t, sid in enumerate(sessions):
        msgs = store.get_messages(sid)
        assert [m["content"] for m in msgs] == [f"{t}:{i}" for i in range(per_thread)]
        assert [m["id"] for m in msgs] == sorted(m["id"] for m in msgs)
    assert store.stats()["messages"] == 8 * per_thread
    assert store.log.verify().ok


def test_reads_see_the_callers_own_writes_at_once(store: SessionStore) -> None:
    sid = store.create_session(source="cli")
    assert store.get_session(sid) is not None
    mid = store.append_message(sid, "user", "hello")
    assert active_ids(store, sid) == [mid]
    store.set_title(sid, "greeting")
    assert session(store, sid)["title"] == "greeting"
    store.pin(sid)
    assert session(store, sid)["pinned"] is True
    store.react(mid, "ann", "👋")
    assert store.get_reactions(mid)[0]["emoji"] == "👋"
    store.record_usage(sid, input_tokens=3)
    assert session(store, sid)["input_tokens"] == 3
    store.update_meta(sid, model="m9", tool_names=["grep"])
    assert (session(store, sid)["model"], session(store, sid)["tool_names"]) == ("m9", ["grep"])
    store.rewind(sid, mid)
    assert active_ids(store, sid) == []
    store.end_session(sid, "bye")
    assert session(store, sid)["end_reason"] == "bye"
    store.delete_session(sid)
    assert store.get_session(sid) is None


def test_v1_message_in_the_log_reads_back_in_v2_shape(store: SessionStore) -> None:
    sid = store.create_session()
    [old] = store.log.append([{"type": "message.appended", "session": sid, "v": 1,
                               "data": {"role": "assistant", "text": "written by eventlog 0.0",
                                        "tool_calls_json": '[{"id": "c1", "type": "function"}]',
                                        "token_count": 7}}])
    [odd] = store.log.append([{"type": "message.appended", "session": sid, "v": 1,
                               "data": {"role": "tool", "text": None, "tool_calls_json": "{not json"}}])
    new = store.append_message(sid, "user", "written now")
    msgs = store.get_messages(sid)
    assert [m["id"] for m in msgs] == [old, odd, new]
    assert all(set(m) == set(MESSAGE_KEYS) for m in msgs)
    assert (msgs[0]["content"], msgs[0]["tool_calls"], msgs[0]["token_count"]) == (
        "written by eventlog 0.0", [{"id": "c1", "type": "function"}], 7)
    assert (msgs[1]["content"], msgs[1]["tool_calls"]) == (None, None)
    assert session(store, sid)["tool_call_count"] == 1
    assert store.log.get(old)["v"] == 1  # type: ignore[index]  # the log itself is never rewritten
    assert found(store, "eventlog") == {old}


def test_session_rows_have_every_documented_key(store: SessionStore) -> None:
    sid = store.create_session()
    assert set(session(store, sid)) == set(SESSION_KEYS)


def test_every_refusal_is_an_eventlog_error(store: SessionStore) -> None:
    sid = store.create_session()
    for bad in (lambda: store.append_message(sid, "user", object()),
                lambda: store.set_title(sid, ""),
                lambda: store.record_usage(sid, input_tokens=-1),
                lambda: store.end_session(sid, "   ")):
        with log_unchanged(store), pytest.raises(EventLogError):
            bad()


def test_a_store_runs_on_any_log_backend(tmp_path: Path) -> None:
    """SessionStore.open(log=...) keeps the events in the given Log; the projections still
    live under the profile directory, and the caller's log outlives the store."""
    from eventlog.log.memory import MemoryLog

    mem = MemoryLog(profile="p")
    with SessionStore.open(tmp_path, "p", log=mem, follower=False) as store:
        sid = store.create_session(source="cli", title="on memory")
        store.append_message(sid, "user", "hello from the memory log")
        assert [m["content"] for m in store.get_messages(sid)] == ["hello from the memory log"]
        assert store.search("memory log")["results"][0]["session_id"] == sid
    assert mem.head()[0] == 2 and not mem.closed
    assert not (tmp_path / "profiles" / "p" / "log").exists()
    with pytest.raises(ValidationError) as info:
        SessionStore.open(tmp_path, "p", log=object())  # type: ignore[arg-type]
    assert info.value.field == "log"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 40), limit=st.none() | st.integers(0, 45), rewind_at=st.none() | st.integers(0, 39),
       before=st.none() | st.integers(0, 45), after=st.none() | st.integers(0, 45), newest_first=st.booleans(),
       include_inactive=st.booleans())
def test_latest_n_and_paging_match_the_fold(tmp_path_factory: pytest.TempPathFactory, n: int, limit: int | None,
                                           rewind_at: int | None, before: int | None, after: int | None,
                                           newest_first: bool, include_inactive: bool) -> None:
    """get_messages(limit=N) is the latest N in chronological order; before/after page; the
    projection answers as the reference fold does."""
    home = tmp_path_factory.mktemp("latest")
    with SessionStore.open(home, "p", follower=False, durability="nosync") as store:
        sid = store.create_session(source="cli")
        ids = store.append_messages(sid, [{"role": "user", "content": f"m{i}"} for i in range(n)]) if n else []
        if rewind_at is not None and rewind_at < n:
            store.rewind(sid, ids[rewind_at])
        seq = lambda k: None if k is None else (ids[k] if k < len(ids) else (ids[-1] + 1 if ids else 1))  # noqa: E731
        kw = dict(limit=limit, before=seq(before), after=seq(after), newest_first=newest_first,
                  include_inactive=include_inactive)
        got = store.get_messages(sid, **kw)
        fold = Fold()
        for env in store.log.read():
            fold.apply(env)
        assert got == fold.get_messages(sid, **kw)
        visible = [m["id"] for m in store.get_messages(sid, include_inactive=include_inactive)]
        window = [i for i in visible if (kw["after"] is None or i > kw["after"]) and (kw["before"] is None or i < kw["before"])]
        if limit is not None:
            window = window[:limit] if kw["after"] is not None and kw["before"] is None else window[max(0, len(window) - limit):]
        assert [m["id"] for m in got] == (window[::-1] if newest_first else window)


def test_the_workspace_filter_is_at_or_under_the_path_for_git_roots_and_cwds(store: SessionStore) -> None:
    """``--workspace PATH``: sessions whose git root or cwd is PATH or under it, with PATH
    normalised. A git root under PATH, the root '/', a trailing slash and a '..' all missed,
    and an empty PATH matched every absolute cwd (outside audit, helper-38)."""
    repo = store.create_session(cwd="/elsewhere", git_repo_root="/work/repo")
    app = store.create_session(cwd="/work/app")
    deep = store.create_session(cwd="/work/app/src/")
    other = store.create_session(cwd="/workshop")
    rel = store.create_session(cwd="rel/dir")

    def ids(path: str) -> set[str]:
        return {s["id"] for s in store.list_sessions(workspace=path, limit=None)}

    assert ids("/work") == ids("/work/") == {repo, app, deep}
    assert ids("/work/app") == ids("/work/app/") == ids("/work/app/../app") == {app, deep}
    assert ids("/") == {repo, app, deep, other}
    assert ids("/work/repo/") == {repo} and ids("rel") == {rel}
    with pytest.raises(ValidationError) as info:
        store.list_sessions(workspace="")
    assert info.value.field == "workspace"


def test_append_message_names_a_refused_field_as_its_caller_passed_it(store: SessionStore) -> None:
    """`append_message(sid, 5, "x")` named `messages[0].role`, a list its caller never passed
    (outside audit, helper-38)."""
    sid = store.create_session()
    head = store.log.head()
    for kwargs, field in (({"role": 5}, "role"), ({"role": "user", "token_count": -1}, "token_count"),
                          ({"role": "wizard"}, "role")):
        with pytest.raises(ValidationError) as info:
            store.append_message(sid, content="x", **kwargs)
        assert info.value.field == field
    with pytest.raises(ValidationError) as info:
        store.append_message(sid, "user", ["x" * (5 << 20), "y" * (5 << 20)])
    assert info.value.field == "content"
    with pytest.raises(ValidationError) as info:
        store.append_messages(sid, [{"role": 5}])
    assert info.value.field == "messages[0].role"  # the batch form names its list
    assert store.log.head() == head


def test_append_events_keeps_titles_unique(store: SessionStore) -> None:
    """A title another session held was appended and acknowledged, then passed over by the fold
    (found by an outside audit through `eventlog append`). It is a TitleConflictError, nothing
    appended; titles the batch itself frees or takes count."""
    from eventlog.errors import TitleConflictError

    store.create_session("a", title="T1")
    store.create_session("b")
    head = store.log.head()

    def titled(sid: str, title: str) -> dict[str, Any]:
        return {"type": "session.titled", "session": sid, "data": {"title": title, "source": "user"}}

    for batch in ([titled("b", "T1")], [{"type": "session.created", "session": "c", "data": {"title": "T1"}}],
                  [titled("b", "T2"), titled("a", "T2")]):
        with pytest.raises(TitleConflictError):
            store.append_events(batch)
        assert store.log.head() == head
    store.append_events([titled("a", "T3"), titled("b", "T1")])  # a lets T1 go first
    assert (store.get_session("a")["title"], store.get_session("b")["title"]) == ("T3", "T1")
    store.append_events([{"type": "session.deleted", "session": "b", "data": {}}, titled("a", "T1")])
    assert store.get_session("a")["title"] == "T1"
