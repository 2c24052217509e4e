"""Imports, third-round outside audit (helper-64): what the earlier audit of the imports left --
a verbatim JSONL import that another process appends into, Hermes JSON columns that do not
decode, a sessions row whose huge column is a BLOB, and a session another process creates with
a Hermes id while the import runs."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import orjson
import pytest
from click.testing import CliRunner

from eventlog.cli import main
from eventlog.errors import ConflictError, IntegrityError
from eventlog.log.lmdb import EventLog
from eventlog.log.memory import MemoryLog
from sqlite_export.hermes import import_hermes, map_session_id
from sqlite_export.jsonl import CHUNK, export_jsonl, import_jsonl

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(Path(__file__).parent))
import fixtures_hermes as fx  # noqa: E402
from test_hermes_import import v22  # noqa: E402

APPENDER = """
import sys
from eventlog.log.lmdb import EventLog
with EventLog.open(sys.argv[1]) as lg:
    lg.append([{"type": "session.created", "session": "elsewhere", "data": {}}])
"""


def _another_process_appends(target: Path) -> None:
    subprocess.run([sys.executable, "-c", APPENDER, str(target)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})


def _export_of_more_than_a_chunk(where: Path) -> tuple[list[bytes], tuple[int, str]]:
    """The JSONL lines of a whole-log export longer than one import chunk, and its log's head."""
    with EventLog.open(where, durability="nosync") as src:
        src.append([{"type": "session.created", "session": "s", "data": {}}])
        src.append([{"type": "message.appended", "session": "s", "data": {"role": "user", "content": f"m{i}"}}
                    for i in range(CHUNK + 10)])
        out = io.BytesIO()
        export_jsonl(src, out)
        return out.getvalue().splitlines(), src.head()


def test_a_verbatim_import_is_all_or_nothing_against_another_appending_process(tmp_path: Path) -> None:
    """A whole-log export into an empty profile went in chunks of sealed events, each its own
    transaction: another process appending after the first chunk left the file's first 2000
    events in the log with the other process's event after them, and the import refused to go
    on (a re-run is refused too). The file now goes in as one transaction under the log's
    writer lock: the other process's event comes before all of it (the import is refused,
    nothing of the file written) or after all of it."""
    lines, head = _export_of_more_than_a_chunk(tmp_path / "src")
    target = tmp_path / "dst"
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        if not seen:  # the first report of progress: the other process appends now
            _another_process_appends(target)
        seen.append(done)

    with EventLog.open(target, durability="nosync") as dst:
        try:
            res = import_jsonl(dst, lines, progress=progress, onto_other_history=False)
        except ConflictError:
            assert dst.head()[0] == 1  # refused: the other process's event alone
        else:
            assert res.mode == "verbatim" and res.imported == len(lines)
            assert dst.get(len(lines))["hash"] == head[1]  # the whole file first, then the other's event
            assert dst.head()[0] == len(lines) + 1
        assert dst.verify().ok
        assert [e["session"] for e in dst.read(1)].count("elsewhere") == 1


def test_hermes_json_columns_that_read_as_null_are_warned_naming_session_and_row(tmp_path: Path) -> None:
    """Issue 5: invalid or double-encoded JSON in model_config, tool_calls, display_metadata is
    coerced "with a warning that names the session and row". The import kept the text and the
    value read as null, with no warning at all."""
    facts = fx.make_current(tmp_path / "state.db")
    rows = facts["rows"]
    assert isinstance(rows, dict)
    report = import_hermes(MemoryLog(), tmp_path / "state.db")
    text = "\n".join(report.warnings)
    for where, column, why in (
            (f"session {fx.S2!r} (sessions row 2)", "model_config", "double-encoded"),
            (f"session {fx.S3!r} (sessions row 3)", "model_config", "not valid JSON"),
            (f"session {fx.S4!r} (sessions row 4)", "model_config", "not an object"),
            (f"session {fx.S2!r} message {rows['m6']}", "tool_calls", "double-encoded"),
            (f"session {fx.S2!r} message {rows['m7']}", "tool_calls", "not valid JSON"),
            (f"session {fx.S2!r} message {rows['m8']}", "display_metadata", "double-encoded"),
            (f"session {fx.S2!r} message {rows['m9']}", "display_metadata", "not valid JSON")):
        assert any(w.startswith(f"{where}: {column} ") and why in w for w in report.warnings), (where, column, text)
    assert all("its text is kept as stored" in w for w in report.warnings if ": tool_calls " in w)
    assert all("it is dropped" in w for w in report.warnings if ": display_metadata " in w)
    assert f"session {fx.S1!r} (sessions row 1): model_config" not in text  # valid JSON: no warning
    assert f"message {rows['m2']}: tool_calls" not in text


CREATOR = """
import sys
from eventlog.log.lmdb import EventLog
with EventLog.open(sys.argv[1]) as lg:
    lg.append([{"type": "session.created", "session": sys.argv[2], "data": {"source": "elsewhere"}}])
"""


def test_hermes_a_session_another_process_creates_with_a_source_id_meanwhile_is_not_merged(tmp_path: Path) -> None:
    """The import checks up front that no source session's id is used here, then appends; a
    session another process created with one of those ids in between got the source session's
    creation, title and messages in its own stream: two histories merged into one. A source
    session's creation is appended only onto an empty stream (expected_version 0): the race
    leaves that source session out, warned, and the other process's session as it made it."""
    source = tmp_path / "state.db"
    n = 1500
    with v22(source) as conn:
        conn.executemany("INSERT INTO sessions (id, source, started_at, title) VALUES (?, 'cli', ?, ?)",
                         [(f"s{i}", 1.0 + i, f"t{i}") for i in range(n)])
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', 'mine', 2.0)",
                     (f"s{n - 1}",))
    conn.close()
    target = tmp_path / "log"
    raced = map_session_id(f"s{n - 1}")  # the source's last session: created after the hook below
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        if done > total // 2 and not calls:  # in the second pass (the first reads every row): appending
            subprocess.run([sys.executable, "-c", CREATOR, str(target), raced], check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            calls.append(done)

    with EventLog.open(target, durability="nosync") as lg:
        report = import_hermes(lg, source, progress=progress)
        assert calls, "the other process never ran"
        mine = list(lg.read_session(raced))
        assert [(e["type"], e["data"].get("source")) for e in mine] == [("session.created", "elsewhere")]
        assert any(w.startswith(f"session 's{n - 1}': another session with this id was created")
                   for w in report.warnings), report.warnings
        assert report.sessions == n - 1 and report.messages == 0 and report.skipped == 1
        assert lg.stream_version(map_session_id("s0")) == 2  # the others: created and titled


# ---- the same on the PostgreSQL log --------------------------------------------------------------


def _export(tmp_path: Path, n: int) -> list[bytes]:
    with EventLog.open(tmp_path / "src", durability="nosync") as src:
        src.append([{"type": "session.created", "session": "s", "data": {}}])
        src.append([{"type": "message.appended", "session": "s", "data": {"role": "user", "content": f"m{i}"}}
                    for i in range(n)])
        out = io.BytesIO()
        export_jsonl(src, out)
    return out.getvalue().splitlines()


@pytest.mark.postgres
def test_pg_a_verbatim_import_is_all_or_nothing_against_another_appending_handle(
        tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    """As on LMDB: the file's chunks were separate transactions on the server, so another
    writer's event landed after the first 2000 of the file's events. One call, one transaction
    under the profile's lock now."""
    from eventlog.log.postgres import PostgresLog

    lines = _export(tmp_path, CHUNK + 10)
    with PostgresLog.open(pg_url, profile=pg_profile) as dst, PostgresLog.open(pg_url, profile=pg_profile) as other:
        seen: list[int] = []

        def progress(done: int, total: int) -> None:
            if not seen:
                other.append([{"type": "session.created", "session": "elsewhere", "data": {}}])
            seen.append(done)

        try:
            res = import_jsonl(dst, lines, progress=progress, onto_other_history=False)
        except ConflictError:
            assert dst.head()[0] == 1
        else:
            assert res.mode == "verbatim" and dst.head()[0] == len(lines) + 1
            assert dst.get(len(lines))["hash"] == orjson.loads(lines[-1])["hash"]
        assert dst.verify().ok
        assert [e["session"] for e in dst.read(1)].count("elsewhere") == 1


@pytest.mark.postgres
def test_pg_append_sealed_past_one_statement_is_still_all_or_nothing(
        tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    """append_sealed writes a whole export in one transaction, SEALED_CHUNK events a statement: an
    event of a later statement that does not fit (an id an earlier statement wrote) leaves
    nothing of the earlier statements behind."""
    import hashlib

    from eventlog.log import codec
    from eventlog.log.postgres import SEALED_CHUNK, PostgresLog

    raws, prev = [], codec.ZERO_HASH
    for seq in range(1, SEALED_CHUNK + 6):
        eid = "dup" if seq in (3, SEALED_CHUNK + 4) else f"e{seq}"
        body = {"type": "x.test", "v": 1, "session": None, "id": eid, "ts": 1, "data": {}, "seq": seq, "prev": prev}
        prev = hashlib.sha256(bytes.fromhex(prev) + codec.canonical(body)).hexdigest()
        raws.append(codec.canonical(dict(body, hash=prev)))
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        with pytest.raises(IntegrityError, match=f"imported event {SEALED_CHUNK + 4} has an already used id"):
            lg.append_sealed(raws)
        assert lg.head() == (0, codec.ZERO_HASH)
        assert lg.append_sealed(raws[:SEALED_CHUNK + 3]) == SEALED_CHUNK + 3 and lg.verify().ok


def test_a_whole_log_export_is_imported_in_bounded_memory(tmp_path: Path) -> None:
    """`eventlog import FILE` read the whole file into memory, each line as bytes, its decoded
    envelope and its stored form (several times the file): a multi-GB export needed several GB.
    A whole-log export from a file is now read twice, a line at a time (checked, then written):
    the import's Python allocations stay a small part of the file's size."""
    import tracemalloc

    with EventLog.open(tmp_path / "src", durability="nosync") as src:
        src.append([{"type": "session.created", "session": "s", "data": {}}])
        for k in range(10):
            src.append([{"type": "message.appended", "session": "s",
                         "data": {"role": "user", "content": f"m{k}-{i} " + "x" * 4000}} for i in range(1000)])
        head = src.head()
        with open(tmp_path / "export.jsonl", "wb") as out:
            export_jsonl(src, out)
    size = (tmp_path / "export.jsonl").stat().st_size
    assert size > 40_000_000
    home = tmp_path / "home"
    tracemalloc.start()
    try:
        r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "import", str(tmp_path / "export.jsonl")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.exit_code == 0 and "mode=verbatim" in r.output and "imported=10001" in r.output, r.output
    assert peak < size // 4, (peak, size)
    with EventLog.open(home / "profiles" / "p" / "log") as lg:
        assert lg.head() == head and lg.verify().ok


def _again(fp: IO[bytes]) -> Callable[[], Iterator[bytes]]:
    """A way to read the lines of ``fp`` anew, as `eventlog import FILE` gives one."""
    return lambda: (fp.seek(0), iter(fp.readline, b""))[1]


@pytest.mark.parametrize("backend", ["lmdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_file_read_twice_that_changed_between_the_readings_imports_nothing(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """Streamed, the file is checked on its first reading and written from its second: a file
    another process cut (or extended) in between would have its other lines written unchecked
    as to count. The second reading must end where the first did: else nothing is written."""
    lines = _export(tmp_path, 2 * 2000 + 10)
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    def target() -> Any:
        if backend == "lmdb":
            return EventLog.open(tmp_path / "dst", durability="nosync")
        from eventlog.log.postgres import PostgresLog

        return PostgresLog.open(request.getfixturevalue("pg_url"), profile=request.getfixturevalue("pg_profile"))

    with target() as log, open(path, "rb") as fp:
        def cut_then_again() -> Iterator[bytes]:
            path.write_bytes(b"\n".join(lines[:-3]) + b"\n")  # another process cuts the file
            return _again(fp)()

        with pytest.raises(IntegrityError, match="the file changed while it was imported"):
            import_jsonl(log, iter(fp.readline, b""), onto_other_history=False, again=cut_then_again)
        assert log.head()[0] == 0
    path.write_bytes(b"\n".join(lines) + b"\n")
    with target() as log, open(path, "rb") as fp:
        res = import_jsonl(log, iter(fp.readline, b""), onto_other_history=False, again=_again(fp))
        assert (res.mode, res.imported) == ("verbatim", len(lines))
        assert log.head()[1] == orjson.loads(lines[-1])["hash"] and log.verify().ok
