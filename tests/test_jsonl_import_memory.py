"""`eventlog import FILE` of a file appended as new events (a session's export, plain events):
the file is read once for each check and once to write, not held in memory, and it answers
what the import of the same bytes from a pipe (held in memory) answers."""
from __future__ import annotations

import io
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pytest
from click.testing import CliRunner

import eventlog.log.lmdb as lmdb_log
from eventlog.cli import main
from eventlog.errors import IntegrityError
from eventlog.log import codec
from eventlog.log.lmdb import EventLog
from sqlite_export import jsonl
from sqlite_export.jsonl import export_jsonl, import_jsonl


def test_a_session_export_from_a_file_is_appended_in_bounded_memory(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The appended mode held the whole file: each line, its envelope, its stored form (orjson's
    bytes, 32 KB allocated each whatever their length) and its event, then appended 2000
    events at a time (one append holds several copies of its events): a 10.8 MB session export
    peaked at 182 MB of Python allocations, a 43 MB one at 574 MB. It now holds a line at a
    time (and a few dozen bytes an event), appending at most CHUNK_BYTES of the file at once."""
    # The log trains its compression dictionary once it holds 2000 events, on their data
    # (bounded by that count, not by the file): kept out of what is measured here.
    monkeypatch.setattr(lmdb_log, "DICT_TRAIN_AFTER", 10**9)
    with EventLog.open(tmp_path / "src", durability="nosync") as src:
        src.append([{"type": "session.created", "session": "s", "data": {}},
                    {"type": "session.created", "session": "t", "data": {}}])  # s's export starts at seq 1, then 3
        for k in range(5):
            src.append([{"type": "message.appended", "session": "s",
                         "data": {"role": "user", "content": f"m{k}-{i} " + "x" * 4000}} for i in range(500)])
        with open(tmp_path / "s.jsonl", "wb") as out:
            assert export_jsonl(src, out, session="s") == 2501
    size = (tmp_path / "s.jsonl").stat().st_size
    assert size > 10_000_000
    home = tmp_path / "home"
    tracemalloc.start()
    try:
        r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "import", "--json", str(tmp_path / "s.jsonl")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.exit_code == 0, r.output
    assert orjson.loads(r.stdout) == {"mode": "appended", "read": 2501, "imported": 2501, "already_present": 0}
    assert peak < size // 2, (peak, size)
    with EventLog.open(home / "profiles" / "p" / "log") as lg:
        assert lg.head()[0] == 2501 and lg.verify().ok
        contents = [e["data"]["content"] for e in lg.read_session("s") if e["type"] == "message.appended"]
    assert contents == [f"m{k}-{i} " + "x" * 4000 for k in range(5) for i in range(500)]


def _exports(tmp_path: Path) -> tuple[list[bytes], list[bytes]]:
    """(session s's export, the whole log's export) of a small log: s has messages and a
    reaction naming one of them; t's events sit between s's."""
    with EventLog.open(tmp_path / "src", durability="nosync") as src:
        src.append([{"type": "session.created", "session": "s", "data": {}, "id": "c-s"}])
        src.append([{"type": "session.created", "session": "t", "data": {}, "id": "c-t"}])
        seqs = src.append([{"type": "message.appended", "session": "s", "id": f"m{i}",
                            "data": {"role": "user", "content": f"m{i}"}} for i in range(5)])
        src.append([{"type": "message.reaction_set", "session": "s", "id": "r1",
                     "data": {"message_id": seqs[1], "emoji": "x", "author": "a"}}])
        src.append([{"type": "message.appended", "session": "t", "id": "mt", "data": {"role": "user", "content": "t"}}])
        session, whole = io.BytesIO(), io.BytesIO()
        export_jsonl(src, session, session="s")
        export_jsonl(src, whole)
    return session.getvalue().splitlines(), whole.getvalue().splitlines()


def _edited(line: bytes, change: Callable[[dict[str, Any]], Any]) -> bytes:
    env = orjson.loads(line)
    change(env)
    return orjson.dumps(env)


HOSTILE: dict[str, Callable[[list[bytes], list[bytes]], list[bytes]]] = {
    "a session's export": lambda s, w: s,
    "a line changed": lambda s, w: [s[0], s[1].replace(b'"content":"m0"', b'"content":"mX"'), *s[2:]],
    "a hash removed": lambda s, w: [*s[:3], _edited(s[3], lambda e: e.pop("hash")), *s[4:]],
    "lines out of order": lambda s, w: [s[0], s[2], s[1], *s[3:]],
    "an id twice": lambda s, w: [*s, _edited(s[2], lambda e: e.update(seq=99))],
    "a key missing, then a line that is no JSON": lambda s, w: [*s[:2], _edited(s[2], lambda e: e.pop("id")),
                                                              *s[3:], b"{not json"],
    "a wide integer": lambda s, w: [s[0], s[1].replace(b'"content":"m0"', b'"content":"m0","n":12345678901234567890123'),
                                    *s[2:]],
    "a reaction's message left out": lambda s, w: [line for line in s if b'"m1"' not in line],
    "plain events of a session never created": lambda s, w: [
        b'{"type":"message.appended","session":"zz","data":{"role":"user","content":"a"},"id":"p1"}'],
    "a whole export with a line missing": lambda s, w: [*w[:3], *w[4:]],
}


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_file_and_a_pipe_of_the_same_bytes_import_alike(tmp_path: Path, case: str, whole: bool) -> None:
    """A file is read once for each check (and each reading must find the first's lines); a
    pipe is held in memory and checked as a whole: both must refuse, append and report the
    same, and a second import of the same bytes must find what the first wrote."""
    session, full = _exports(tmp_path)
    data = b"\n".join(HOSTILE[case](session, full)) + b"\n"
    (tmp_path / "f.jsonl").write_bytes(data)
    answers = []
    for how in ("file", "pipe"):
        args = ["--home", str(tmp_path / how), "--profile", "p", "import", "--json", *(["--whole"] if whole else [])]
        for _ in range(2):
            r = CliRunner().invoke(main, [*args, str(tmp_path / "f.jsonl")] if how == "file" else [*args, "-"],
                                   input=None if how == "file" else data)
            answers.append((r.exit_code, r.stdout, r.stderr))
    assert answers[:2] == answers[2:], answers
    if case == "a session's export" and not whole:
        assert [orjson.loads(out) for _, out, _ in answers[:2]] == [
            {"mode": "appended", "read": 7, "imported": 7, "already_present": 0},
            {"mode": "appended", "read": 7, "imported": 0, "already_present": 7}]


def _rereading(path: Path, lines: list[bytes], change_at: int, changed: list[bytes]) -> Callable[[], Iterator[bytes]]:
    """The file's lines read anew at each call, as `eventlog import FILE` reads them; another
    process writes ``changed`` into the file just before the ``change_at``-th reading."""
    readings = 0

    def again() -> Iterator[bytes]:
        nonlocal readings
        readings += 1
        if readings == change_at:
            path.write_bytes(b"\n".join(changed) + b"\n")
        return iter(path.read_bytes().splitlines(keepends=True))

    path.write_bytes(b"\n".join(lines) + b"\n")
    return again


def _forged(line: bytes, content: str) -> bytes:
    """``line`` with another message content and its own hash computed anew, as a forger would."""
    env = orjson.loads(line)
    env["data"]["content"] = content
    env["hash"] = "0" * 64
    env["hash"] = codec.hash_without(codec.sealed_bytes(env), env["hash"], env["prev"])
    return orjson.dumps(env)


@pytest.mark.parametrize("change_at", [3, 4, 5, 6])
def test_a_file_that_changes_between_the_readings_of_an_appended_import_is_refused(
        tmp_path: Path, change_at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file appended as new events is read once to find whether it is a chain (1), once for
    each check (2: the lines' keys, 3: their hashes and order, 4: their events and ids, 5: the
    sessions) and once to write (6). Each reading after the second checks its lines against a
    digest of that one's: a line changed after the checks read it (a message whose own hash a
    forger recomputed) is never written unchecked. Changed before the writing reading, nothing
    is imported; during it, what was appended before the changed line stays, as after an import
    killed there, and the untouched file's import goes on from it."""
    monkeypatch.setattr(jsonl, "CHUNK", 2)  # appends of two events: the last reading writes some before the change
    session, _ = _exports(tmp_path)
    changed = [*session[:-2], _forged(session[-2], "forged"), session[-1]]
    path = tmp_path / "f.jsonl"
    with EventLog.open(tmp_path / "dst", durability="nosync") as log:
        again = _rereading(path, session, change_at, changed)
        with pytest.raises(IntegrityError, match="the file changed while it was imported") as e:
            import_jsonl(log, again(), onto_other_history=False, again=again)
        written = list(log.read(1))
        assert [ev["id"] for ev in written] == (["c-s", "m0", "m1", "m2"] if change_at == 6 else [])
        assert ("4 of the 7 events it appends anew were appended before" in str(e.value)) == (change_at == 6)
        again = _rereading(path, session, 0, [])
        res = import_jsonl(log, again(), onto_other_history=False, again=again)
        assert (res.mode, res.imported, res.already_present) == ("appended", 7 - len(written), len(written))
        assert [ev["data"].get("content") for ev in log.read(1) if ev["type"] == "message.appended"] == \
            [f"m{i}" for i in range(5)]
        reaction = next(ev for ev in log.read(1) if ev["type"] == "message.reaction_set")
        assert log.get(reaction["data"]["message_id"])["id"] == "m1"


def test_a_forged_line_in_a_file_read_through_unchanged_is_its_own_vouch(tmp_path: Path) -> None:
    """The other side of the test above: the same forged file, unchanged from its first reading
    on, is appended (a line's hash vouches for its bytes only: a session's export is no chain)."""
    session, _ = _exports(tmp_path)
    changed = [*session[:-2], _forged(session[-2], "forged"), session[-1]]
    with EventLog.open(tmp_path / "dst", durability="nosync") as log:
        again = _rereading(tmp_path / "f.jsonl", changed, 0, [])
        res = import_jsonl(log, again(), onto_other_history=False, again=again)
        assert (res.mode, res.imported) == ("appended", 7)
        assert [ev["data"].get("content") for ev in log.read(1) if ev["type"] == "message.appended"][-1] == "forged"


def test_a_file_that_grows_after_its_first_reading_is_refused(tmp_path: Path) -> None:
    """Another process appends a line to the file after the reading that took the digests (a
    log export written into the file being imported): refused, naming the line past the end."""
    session, _ = _exports(tmp_path)
    extra = b'{"type":"session.created","session":"late","data":{},"id":"late"}'
    with EventLog.open(tmp_path / "dst", durability="nosync") as log:
        again = _rereading(tmp_path / "f.jsonl", session, 3, [*session, extra])
        with pytest.raises(IntegrityError, match=r"it grew: line 8 is past the 7 lines its first reading found"):
            import_jsonl(log, again(), onto_other_history=False, again=again)
        assert log.head()[0] == 0
