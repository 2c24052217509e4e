"""The audit round trip: export the log as JSONL, import it elsewhere."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.errors import ConflictError, DuplicateEventError, IntegrityError, ValidationError
from eventlog.log import EventLog
from sqlite_export.jsonl import export_jsonl, import_jsonl


def ev(session: str, **data: Any) -> dict[str, Any]:
    return {"type": "test.happened", "session": session, "data": data}


def dump(lg: Any) -> bytes:
    buf = io.BytesIO()
    export_jsonl(lg, buf)
    return buf.getvalue()


def test_export_then_import_into_empty_profile_reproduces_seqs_and_hashes(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([ev("s1", n=1), ev("s2", n=2)])
        a.append([dict(ev("s1", n=3), id="fixed")])
        data = dump(a)
        head = a.head()
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        res = import_jsonl(b, data.splitlines())
        assert (res.mode, res.imported) == ("verbatim", 3)
        assert b.head() == head and b.verify().ok
        assert dump(b) == data
        assert [e["seq"] for e in b.read_session("s1")] == [1, 3]
        assert b.event_seq("fixed") == 3
        # importing again is a no-op
        again = import_jsonl(b, data.splitlines())
        assert (again.imported, b.head()) == (0, head)


def test_a_re_serialised_whole_export_is_restored_not_appended(tmp_path: Path) -> None:
    """The hashes cover each envelope's canonical bytes, so an export passed through another
    JSON writer (key order, spacing, escapes) is the same log; it used to be appended anew, with
    new seqs and hashes, under a warning about missing lines."""
    import json

    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([ev("s1", text="café 🎉", n=1.5), ev("s2", n=2)])
        data, head = dump(a), a.head()
    rewritten = [json.dumps(json.loads(line), indent=1, ensure_ascii=True).encode().replace(b"\n", b"")
                 for line in data.splitlines()]
    assert rewritten != data.splitlines()
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        res = import_jsonl(b, rewritten, whole=True)
        assert (res.mode, res.imported, b.head()) == ("verbatim", 2, head)
        assert dump(b) == data and b.verify().ok
    changed = [rewritten[0].replace(b"caf\\u00e9", b"cafe"), rewritten[1]]  # the hash still catches a change
    assert changed[0] != rewritten[0]
    with EventLog.open(tmp_path / "c", durability="nosync") as c, pytest.raises(IntegrityError):
        import_jsonl(c, changed, whole=True)


def test_import_continues_a_log_that_is_a_prefix(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([ev("s1", n=1)])
        first = dump(a)
        a.append([ev("s1", n=2)])
        full, head = dump(a), a.head()
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        import_jsonl(b, first.splitlines())
        res = import_jsonl(b, full.splitlines())
        assert (res.mode, res.imported, b.head()) == ("verbatim", 1, head)


def test_import_into_another_history_appends_new_events(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([dict(ev("s1", n=1), id="x1"), dict(ev("s1", n=2), id="x2")])
        data = dump(a)
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        b.append([ev("other", n=0), dict(ev("s1", n=1), id="x1")])
        res = import_jsonl(b, data.splitlines())
        assert (res.mode, res.imported, res.already_present) == ("appended", 1, 1)
        assert b.head()[0] == 3 and b.verify().ok
        assert b.get(3)["id"] == "x2"


def test_conflicting_id_refuses_the_whole_import(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([dict(ev("s1", n=1), id="new-one"), dict(ev("s1", n=2), id="clash")])
        data = dump(a)
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        b.append([dict(ev("s1", n=99), id="clash")])
        before = list(b.read(raw=True))
        with pytest.raises(DuplicateEventError):
            import_jsonl(b, data.splitlines())
        assert list(b.read(raw=True)) == before


def test_a_tampered_export_is_refused_not_laundered_into_fresh_hashes(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([ev("s1", text="kept"), ev("s1", text="original"), ev("s1", text="after")])
        data = dump(a)
    forged = data.replace(b"original", b"forged!!")
    for target in ("empty", "other-history"):
        with EventLog.open(tmp_path / target, durability="nosync") as b:
            if target == "other-history":
                b.append([ev("other", n=0)])
            before = list(b.read(raw=True))
            with pytest.raises(IntegrityError, match="line 2 .*hash does not match its content"):
                import_jsonl(b, forged.splitlines())
            assert list(b.read(raw=True)) == before  # nothing of the file was written
    # Lines that claim no hash are plain events (nothing to vouch for); a file that is not one
    # whole chain from seq 1 (a line left out, a session's export) is appended as new events.
    lines = data.splitlines()
    with EventLog.open(tmp_path / "gap", durability="nosync") as b:
        res = import_jsonl(b, [lines[0], lines[2]])
        assert (res.mode, res.imported) == ("appended", 2) and b.verify().ok
    import orjson
    plain = [orjson.dumps({k: v for k, v in orjson.loads(line).items() if k in ("type", "session", "data", "id")})
             for line in lines]
    with EventLog.open(tmp_path / "plain", durability="nosync") as b:  # plain events are checked as `append` checks
        with pytest.raises(ValidationError, match="line 1.type: unknown event type 'test.happened'"):
            import_jsonl(b, plain)
        assert b.head()[0] == 0
        catalogue = [{"type": "session.created", "session": "s1", "data": {"source": "cli"}, "id": "c1"},
                     {"type": "message.appended", "session": "s1", "data": {"role": "user", "content": "hi"}, "id": "m1"}]
        assert import_jsonl(b, [orjson.dumps(e) for e in catalogue]).imported == 2


def test_append_sealed_refuses_a_gap(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([ev("s1", n=1), ev("s1", n=2)])
        raws = [bytes(v) for _, v in a.read(raw=True)]
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        with pytest.raises(IntegrityError):
            b.append_sealed([raws[1]])
        assert b.head()[0] == 0


def test_garbage_lines_are_refused(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        with pytest.raises(ValidationError) as info:
            import_jsonl(b, [b"{not json"])
        assert info.value.field == "line 1"


@settings(max_examples=40)
@given(st.lists(st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.text(max_size=20), st.integers(-(2**63), 2**63 - 1)),
                min_size=1, max_size=15))
def test_export_import_round_trip_property(tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, str, int]]) -> None:
    d = tmp_path_factory.mktemp("rt")
    with EventLog.open(d / "a", durability="nosync") as a:
        for s, text, n in rows:
            a.append([ev(s, text=text, n=n)])
        data, head = dump(a), a.head()
    with EventLog.open(d / "b", durability="nosync") as b:
        import_jsonl(b, io.BytesIO(data))
        assert b.head() == head and dump(b) == data and b.verify().ok


def test_an_exported_line_whose_hash_was_removed_is_refused(tmp_path: Path) -> None:
    """Changing a line and deleting its hash laundered the change: the line counted as a plain
    event and the import went through (found by an outside audit). A line with a seq or prev
    but no hash, or without a hash in a file whose other lines have theirs, is refused."""
    import orjson

    with EventLog.open(tmp_path / "a", durability="nosync") as a:
        a.append([ev("s1", text="kept"), ev("s1", text="original"), ev("s1", text="after")])
        lines = dump(a).splitlines()
    changed = orjson.loads(lines[1].replace(b"original", b"mallory!"))
    del changed["hash"]
    bare = {k: v for k, v in changed.items() if k in ("type", "session", "data", "id")}  # no seq or prev either
    for forged, why in ((changed, "no hash: an exported line whose hash was removed"),
                        (bare, "no hash where the file's other lines have theirs")):
        with EventLog.open(tmp_path / f"b{len(forged)}", durability="nosync") as b:
            with pytest.raises(IntegrityError, match=f"line 2 .*{why}"):
                import_jsonl(b, [lines[0], orjson.dumps(forged), lines[2]])
            assert b.head()[0] == 0


def test_a_sessions_export_appended_elsewhere_keeps_what_its_events_name_by_seq(tmp_path: Path) -> None:
    """Appended events get new seqs, so a rewind, a reaction, a usage record's message and a
    `reactions.seen` that named the exported seqs used to land on the wrong messages (the
    imported session showed a message its source had rewound away). They are renumbered."""
    from eventlog.sessions.store import SessionStore

    def state(store: SessionStore, sid: str) -> dict[str, Any]:
        msgs = store.get_messages(sid, include_inactive=True)
        text = {m["id"]: m["content"] for m in msgs}
        return {"messages": [(m["content"], m["active"]) for m in msgs],
                "reactions": {text[m["id"]]: [(r["emoji"], r["seen"]) for r in store.get_reactions(m["id"])]
                              for m in msgs},
                "usage": [(e["data"]["input_tokens"], text.get(e["data"]["message_id"]))  # kept in the log only
                          for e in store.log.read_session(sid) if e["type"] == "usage.recorded"]}

    with SessionStore.open(tmp_path, "a", follower=False) as a:
        other = a.create_session(source="cli", title="other")
        sid = a.create_session(source="cli", title="exported")
        ids = []
        for i in range(6):  # the two sessions interleave: the export's seqs are not 1..n
            a.append_message(other, "user", f"other {i}")
            ids.append(a.append_message(sid, "user", f"m{i}"))
        a.react(ids[1], "ana", "👍")
        a.take_unseen_reactions(sid)  # reactions.seen up to here
        a.react(ids[2], "bo", "🎉")  # set after: stays unseen
        a.record_usage(sid, input_tokens=7, message_id=ids[3])
        a.rewind(sid, ids[4])
        expected = state(a, sid)
        buf = io.BytesIO()
        export_jsonl(a.log, buf, session=sid)
    assert expected["messages"][4:] == [("m4", False), ("m5", False)] and expected["usage"] == [(7, "m3")]
    with SessionStore.open(tmp_path, "b", follower=False) as b:
        res = import_jsonl(b.log, buf.getvalue().splitlines())
        assert res.mode == "appended"
        assert state(b, sid) == expected
        again = import_jsonl(b.log, buf.getvalue().splitlines())  # idempotent: the renumbered events are the same
        assert (again.imported, again.already_present) == (0, res.imported)


def test_a_sessions_export_appended_elsewhere_keeps_its_times(tmp_path: Path) -> None:
    """A message's timestamp and a session's start and end read as the event's own time when
    the writer left them out; appended anew, the events get new times, so the imported session
    used to read as started, ended and written at the import."""
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path, "a", follower=False) as a:
        a.create_session(source="cli", title="other")
        sid = a.create_session(source="cli", title="exported")
        a.append_message(sid, "user", "left to the event time")
        a.append_message(sid, "assistant", "given", timestamp=1_000_000.5)
        a.end_session(sid, "done")
        expected = (a.get_session(sid), a.get_messages(sid))
        buf = io.BytesIO()
        export_jsonl(a.log, buf, session=sid)
    assert expected[1][1]["timestamp"] == 1_000_000.5
    with SessionStore.open(tmp_path, "b", follower=False) as b:
        b.create_session(source="cli", title="b's own")
        res = import_jsonl(b.log, buf.getvalue().splitlines())
        assert res.mode == "appended"
        assert (b.get_session(sid), b.get_messages(sid)) == expected
        again = import_jsonl(b.log, buf.getvalue().splitlines())  # the events with their times are the same
        assert (again.imported, again.already_present) == (0, res.imported)
    with SessionStore.open(tmp_path, "a", follower=False) as a:  # and its own profile holds them as written
        assert import_jsonl(a.log, buf.getvalue().splitlines()).imported == 0


def test_a_plain_events_file_is_checked_as_append_checks_it(tmp_path: Path) -> None:
    """A file of plain events (no seq, prev or hash) skipped the catalogue and the session checks
    that `eventlog append` makes (found by an outside audit): a bad role, an unknown type, a
    message of a session that does not exist, a second session.created all went in."""
    import orjson

    created = {"type": "session.created", "session": "s1", "data": {"source": "cli"}, "id": "c1"}

    def msg(n: int, **data: Any) -> dict[str, Any]:
        return {"type": "message.appended", "session": "s1", "id": f"m{n}", "data": {"role": "user", "content": "x", **data}}

    bad = [([created, msg(1, role="bogus")], r"line 2.data.role"),
           ([created, {"type": "nonsense.kind", "session": "s1", "data": {}, "id": "n1"}], r"line 2.type"),
           ([msg(1)], r"line 1.session: session 's1' does not exist"),
           ([created, dict(created, id="c2")], r"line 2.session: session 's1' already exists"),
           ([created, {**msg(1), "v": 9}], r"line 2.v"),
           ([created, {**msg(1), "extra": 1}], r"line 2.extra")]
    for n, (events, match) in enumerate(bad):
        with EventLog.open(tmp_path / f"p{n}", durability="nosync") as lg:
            with pytest.raises(ValidationError, match=match):
                import_jsonl(lg, [orjson.dumps(e) for e in events])
            assert lg.head()[0] == 0, match
    with EventLog.open(tmp_path / "dup", durability="nosync") as lg:  # as append: a repeated key is refused
        twice = b'{"type":"message.appended","session":"s1","id":"m1","data":{"role":"user","content":"a","role":"tool"}}'
        with pytest.raises(ValidationError, match=r"line 2: the key 'role' appears twice"):
            import_jsonl(lg, [orjson.dumps(created), twice])
        assert lg.head()[0] == 0
    with EventLog.open(tmp_path / "ok", durability="nosync") as lg:
        res = import_jsonl(lg, [orjson.dumps(e) for e in (created, msg(1, content="  kept  "))])
        assert res.imported == 2 and lg.get(2)["data"]["content"] == "  kept  "


def test_an_integer_outside_64_bits_is_refused_not_imported_as_a_float(tmp_path: Path) -> None:
    line = b'{"type":"session.created","session":"s1","id":"c1","data":{"source":"cli","n":18446744073709551616}}'
    with EventLog.open(tmp_path / "p", durability="nosync") as lg:
        with pytest.raises(ValidationError, match=r"line 1.data.n: is an integer outside the 64-bit range"):
            import_jsonl(lg, [line])
        assert lg.head()[0] == 0


def _rehashed(line: bytes, **change: Any) -> bytes:
    """An exported line changed and its own hash recomputed: it vouches for itself again."""
    import hashlib

    import orjson

    from eventlog.log import codec

    env = orjson.loads(line)
    env.update(change)
    body = {k: v for k, v in env.items() if k != "hash"}
    env["hash"] = hashlib.sha256(bytes.fromhex(env["prev"]) + codec.canonical(body)).hexdigest()
    return codec.canonical(env)


def test_exported_lines_appended_anew_are_checked_as_append_checks_them(tmp_path: Path) -> None:
    """A line's own hash vouches for its bytes, not that eventlog wrote them: a changed line with
    its hash recomputed wrote a role, a type, a session and references `append` refuses (found
    by an outside audit), and a reaction naming a message the file does not carry was kept,
    naming another event after renumbering."""
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path, "a", follower=False) as a:
        other = a.create_session(source="cli")
        sid = a.create_session(source="cli")
        first = a.append_message(sid, "user", "first")
        a.append_message(other, "user", "elsewhere")
        second = a.append_message(sid, "user", "second")
        a.react(second, "ana", "👍")
        a.record_usage(sid, input_tokens=3, message_id=a.append_message(other, "user", "x"))
        buf = io.BytesIO()
        export_jsonl(a.log, buf, session=sid)
    lines = buf.getvalue().splitlines()  # created, first, second, reaction, usage
    import orjson

    msg = orjson.loads(lines[1])
    cases = [(1, {"data": {**msg["data"], "role": "wizard"}}, r"line 2.data.role"),
             (1, {"type": "message.bogus"}, r"line 2.type: unknown event type"),
             (1, {"session": "ghost"}, r"line 2.session: session 'ghost' does not exist"),
             (3, {"data": {"message_id": first + 1, "author": "ana", "emoji": "👍"}}, r"line 4.data.message_id")]  # "elsewhere"
    for n, (at, change, match) in enumerate(cases):
        forged = list(lines)
        forged[at] = _rehashed(lines[at], **change)
        with EventLog.open(tmp_path / f"b{n}", durability="nosync") as b:
            with pytest.raises(ValidationError, match=match):
                import_jsonl(b, forged)
            assert b.head()[0] == 0, match
    with SessionStore.open(tmp_path, "c", follower=False) as c:
        assert import_jsonl(c.log, lines).mode == "appended"
        usage = [e for e in c.log.read_session(sid) if e["type"] == "usage.recorded"]
        assert usage and "message_id" not in usage[0]["data"]  # another session's message: not carried
        [reacted] = [m for m in c.get_messages(sid) if c.get_reactions(m["id"])]
        assert reacted["content"] == "second"


def test_a_plain_event_without_an_id_is_refused_with_a_way_on(tmp_path: Path) -> None:
    """An import needs ids (a second import must find what the first wrote); the refusal said only
    'missing from the envelope', though `eventlog append` takes the same line."""
    with EventLog.open(tmp_path / "a", durability="nosync") as lg:
        with pytest.raises(ValidationError) as e:
            import_jsonl(lg, [b'{"type": "session.created", "session": "s1", "data": {}}'])
        assert e.value.field == "line 1.id" and "eventlog append" in str(e.value.hint)
        assert lg.head()[0] == 0


def test_a_plain_event_with_a_lone_surrogate_escape_imports_as_append_takes_it(tmp_path: Path) -> None:
    """`eventlog append` stores a lone surrogate escape as U+FFFD (docs/EVENTS.md); an import of
    the same plain line refused it as 'not a JSON object'."""
    from eventlog.sessions.store import SessionStore

    line = b'{"id": "e1", "type": "session.created", "session": "s1", "data": {"title": "caf\\ud800"}}'
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        res = import_jsonl(store.log, [line])
        assert (res.mode, res.imported) == ("appended", 1)
        assert store.get_session("s1")["title"] == "caf\ufffd"
        assert import_jsonl(store.log, [line]).imported == 0  # and again: found, not refused
    with EventLog.open(tmp_path / "b", durability="nosync") as lg, pytest.raises(ValidationError):
        import_jsonl(lg, [b'{"id": "e1", "type": "session.created", "data": {"title": "\xff"}}'])  # bytes stay refused


def test_a_deleted_parent_and_its_childrens_deletes_append_as_exported(tmp_path: Path) -> None:
    """SessionStore deletes a session's descendants after it, each by its own event; appended
    anew (a file that is not one whole chain), the child's delete was refused as naming a session
    that does not exist, so no such export could be imported (found by an outside audit). A
    delete of a session that was never created, or deleted twice by its own events, still is."""
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path, "a", follower=False) as a:
        keep = a.create_session(source="cli")
        a.append_message(keep, "user", "kept")
        parent = a.create_session(source="cli")
        child = a.create_session(source="cli", parent_session_id=parent)
        a.append_message(child, "user", "in the child")
        a.delete_session(parent)
        lines = dump(a.log).splitlines()
    cut = lines[:1] + lines[2:]  # a line missing: not one whole chain, appended as new events
    with SessionStore.open(tmp_path, "b", follower=False) as b:
        assert import_jsonl(b.log, cut).mode == "appended"
        assert [s["id"] for s in b.list_sessions()] == [keep]
        assert b.get_session(parent) is None and b.get_session(child) is None
    import orjson

    child_delete = next(ln for ln in lines if orjson.loads(ln)["type"] == "session.deleted"
                        and orjson.loads(ln)["session"] == child)
    twice = cut + [_rehashed(child_delete, id="again-1", seq=99)]
    for n, bad in enumerate(([_rehashed(child_delete, session="never-made")], twice)):
        with EventLog.open(tmp_path / f"c{n}", durability="nosync") as c:
            with pytest.raises(ValidationError, match="does not exist"):
                import_jsonl(c, bad)
            assert c.head()[0] == 0


def test_an_append_import_stopped_part_way_goes_on_when_run_again(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An import appends in chunks; one killed between chunks left a profile that the same
    import then refused ("already holds N events that are not the start of this export"), so
    it could never be finished in place (found by an outside audit). The log holds only this
    file's events: the import goes on, and the result is the one an unbroken import gives."""
    import sqlite_export.jsonl as jsonl
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path, "a", follower=False) as a:
        a.create_session(id="other", source="cli")
        a.create_session(id="s", source="cli")
        firsts = [a.append_message("s", "user", f"m{i}") for i in range(12)]
        a.react(firsts[1], "ana", "👍")
        buf = io.BytesIO()
        export_jsonl(a.log, buf, session="s")
        want = [(m["content"], m["role"]) for m in a.get_messages("s")]
    lines = buf.getvalue().splitlines()
    monkeypatch.setattr(jsonl, "CHUNK", 4)
    real, calls = EventLog.append, []

    def stops_after_two_chunks(self: EventLog, events: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(events))
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process stops here, between chunks
        return real(self, events, *args, **kwargs)

    with SessionStore.open(tmp_path, "b", follower=False) as b:
        monkeypatch.setattr(EventLog, "append", stops_after_two_chunks)
        with pytest.raises(KeyboardInterrupt):
            import_jsonl(b.log, lines, onto_other_history=False)
        monkeypatch.setattr(EventLog, "append", real)
        assert b.log.head()[0] == 8
        done = import_jsonl(b.log, lines, onto_other_history=False)
        assert (done.mode, done.imported, done.already_present) == ("appended", len(lines) - 8, 8)
        assert [(m["content"], m["role"]) for m in b.get_messages("s")] == want
        reacted = [m["content"] for m in b.get_messages("s") if b.get_reactions(m["id"])]
        assert reacted == ["m1"]
        assert import_jsonl(b.log, lines, onto_other_history=False).imported == 0  # and again: nothing
        b.create_session(id="mine", source="cli")
    with SessionStore.open(tmp_path, "b", follower=False) as b, pytest.raises(ConflictError):
        import_jsonl(b.log, [_rehashed(lines[2], id="new-1")], onto_other_history=False)  # other history now


def test_an_export_whose_lines_were_reordered_is_refused(tmp_path: Path) -> None:
    """Lines appended in file order: two swapped lines turned a message that is live at the
    source into a rewound one, with only the "not one whole chain" note (found by an outside
    audit). An export's lines are in seq order: a file whose seqs go back is refused."""
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path, "a", follower=False) as a:
        a.create_session(source="cli")  # so that the session's export is not a whole chain
        sid = a.create_session(source="cli")
        first = a.append_message(sid, "user", "one")
        a.append_message(sid, "user", "two")
        a.rewind(sid, first)
        a.append_message(sid, "user", "three")
        buf = io.BytesIO()
        export_jsonl(a.log, buf, session=sid)
    lines = buf.getvalue().splitlines()
    swapped = lines[:2] + [lines[3], lines[2]] + lines[4:]
    with EventLog.open(tmp_path / "b", durability="nosync") as b:
        with pytest.raises(IntegrityError, match=r"line 4 holds seq \d+ after seq \d+ \(line 3\)"):
            import_jsonl(b, swapped)
        assert b.head()[0] == 0
        assert import_jsonl(b, lines).mode == "appended"


def test_a_sessions_export_carries_its_lineage(tmp_path: Path) -> None:
    """Flags are lineage properties, recorded in the stream of the member they were set on, and
    a child's creation names its parent: a session's export held only its own stream, so the
    root's export lost a pin set through its child, and a child's export could not be imported
    at all (found by an outside audit). It now holds the lineage: the root and all under it."""
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path, "a", follower=False) as a:
        a.create_session(id="elsewhere", source="cli")
        a.create_session(id="root", source="cli")
        a.create_session(id="kid", source="cli", parent_session_id="root")
        a.create_session(id="grandkid", source="cli", parent_session_id="kid")
        a.append_message("kid", "user", "in the kid")
        a.pin("kid")
        a.archive("grandkid")
        files = {}
        for sid in ("root", "grandkid"):
            buf = io.BytesIO()
            export_jsonl(a.log, buf, session=sid)
            files[sid] = buf.getvalue().splitlines()
        want = {s["id"]: (s["pinned"], s["archived"]) for s in a.list_sessions(archived=True) if s["id"] != "elsewhere"}
    assert files["root"] == files["grandkid"]
    with SessionStore.open(tmp_path, "b", follower=False) as b:
        assert import_jsonl(b.log, files["grandkid"]).mode == "appended"
        got = {s["id"]: (s["pinned"], s["archived"]) for s in b.list_sessions(archived=True)}
        assert got == want == {"root": (True, True), "kid": (True, True), "grandkid": (True, True)}
        assert [m["content"] for m in b.get_messages("kid")] == ["in the kid"]
