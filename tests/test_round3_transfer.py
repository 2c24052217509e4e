"""Imports and exports, third-round outside audit (helper-60): Hermes databases with rows Hermes'
schema lets through (a sessions row whose TEXT PRIMARY KEY is NULL), another column order, and a
source another process is writing while the import reads it."""
from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlog.cli import main
from eventlog.errors import ConflictError
from eventlog.log.lmdb import EventLog
from eventlog.sessions.store import SessionStore
from sqlite_export.jsonl import export_jsonl, import_jsonl

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_hermes import make_current  # noqa: E402
from test_hermes_import import v22  # noqa: E402
from test_round3_imports import _another_process_appends, _export_of_more_than_a_chunk  # noqa: E402


def _import(home: Path, profile: str, source: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", profile, "import", "--format", "hermes",
                                  str(source)])
    return r.exit_code, r.output


def _envelopes(home: Path, profile: str) -> list[dict[str, object]]:
    lg = EventLog.open(home / "profiles" / profile / "log")
    try:
        return list(lg.read(1))
    finally:
        lg.close()


def test_hermes_sessions_rows_without_an_id_are_left_out_with_a_warning(tmp_path: Path) -> None:
    """Hermes' ``sessions.id`` is a TEXT PRIMARY KEY, which SQLite lets be NULL. One such row was
    imported as a ``session.created`` (and ``session.titled``) about no session at all; two failed
    the whole import with "the same event id appears twice in one batch" (after earlier batches
    were stored, on a large file); and a NULL row holding a real session's title took it from
    that session. Now they are left out, each warned, and the real sessions import whole."""
    source = tmp_path / "state.db"
    with v22(source) as conn:
        conn.execute("DROP INDEX idx_sessions_title_unique")  # as in a database older than that index
        conn.execute("INSERT INTO sessions (id, source, started_at, title) VALUES ('a', 'cli', 1.0, 'Shared')")
        conn.execute("INSERT INTO sessions (id, source, started_at, title) VALUES (NULL, 'cli', 2.0, 'Shared')")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (NULL, 'cli', 3.0)")
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('a', 'user', 'hi', 1.5)")
    conn.close()
    home = tmp_path / "home"
    code, out = _import(home, "p", source)
    assert code == 0, out
    assert "sessions row 2 has no id (NULL)" in out and "sessions row 3 has no id (NULL)" in out, out
    about_nothing = [e for e in _envelopes(home, "p") if str(e["type"]).startswith("session.") and e["session"] is None]
    assert about_nothing == []
    with SessionStore.open(home=home, profile="p") as store:
        assert [s["id"] for s in store.list_sessions(archived=None, hidden=None)] == ["a"]
        a = store.get_session("a")
        assert a is not None and a["title"] == "Shared"
        assert [m["content"] for m in store.get_messages("a")] == ["hi"]


def test_hermes_usage_rows_are_found_whatever_the_column_order(tmp_path: Path) -> None:
    """The usage rows' session was read from their first column: a ``session_model_usage`` table
    whose columns come in another order (a table rebuilt by another schema version) lost every
    usage row, warned as orphans of sessions named by its model column."""
    source = tmp_path / "state.db"
    with v22(source) as conn:
        conn.execute("DROP TABLE session_model_usage")
        conn.execute("CREATE TABLE session_model_usage (model TEXT NOT NULL, session_id TEXT NOT NULL, "
                     "task TEXT NOT NULL DEFAULT '', api_call_count INTEGER NOT NULL DEFAULT 0, "
                     "input_tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session_id, model, task))")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('a', 'cli', 1.0)")
        conn.execute("INSERT INTO session_model_usage (model, session_id, task, api_call_count, input_tokens) "
                     "VALUES ('gpt-x', 'a', 'chat', 3, 120), ('gpt-y', 'a', 'title', 1, 7)")
    conn.close()
    home = tmp_path / "home"
    code, out = _import(home, "p", source)
    assert code == 0, out
    assert "orphans" not in out, out
    usage = [e["data"] for e in _envelopes(home, "p") if e["type"] == "usage.recorded"]
    assert sorted((u["model"], u["task"], u["api_call_count"], u["input_tokens"]) for u in usage) == [  # type: ignore[index]
        ("gpt-x", "chat", 3, 120), ("gpt-y", "title", 1, 7)]


SPILLING_WRITER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2:] == ["no-journal"]:
    c.execute("PRAGMA journal_mode=MEMORY")  # no journal file beside the database
c.execute("PRAGMA cache_size=2")  # the transaction's pages spill into the file before it commits
c.execute("BEGIN EXCLUSIVE")
for i in range(2000):
    c.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('a', 'user', ?, ?)",
              ("UNCOMMITTED %d " % i + "y" * 300, 10.0 + i))
print("writing", flush=True)
sys.stdin.readline()
c.execute("ROLLBACK")
"""
"""A writer inside a transaction that has spilled into the file, until a line on its stdin (then
it rolls back); ``no-journal`` keeps its journal in memory, else a -journal stands beside the file."""


def test_hermes_a_source_another_process_is_writing_is_refused_not_read_half_written(tmp_path: Path) -> None:
    """A source locked by a writer with no sidecar file (its journal in memory; or a rollback
    journal not created yet when the import looked) was read with ``immutable=1``, ignoring the
    lock: the import read pages of a transaction that never committed, and either imported its
    rows or called the source damaged ("database disk image is malformed", with a hint to
    `.recover` it). Now the lock is reported as one (stop Hermes and retry) and nothing is
    imported."""
    source = tmp_path / "state.db"
    with v22(source) as conn:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('a', 'cli', 1.0)")
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('a', 'user', 'kept', 2.0)")
    conn.close()
    writer = subprocess.Popen([sys.executable, "-c", SPILLING_WRITER, str(source), "no-journal"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        home = tmp_path / "home"
        code, out = _import(home, "p", source)
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        writer.wait(60)
    assert code == 1 and "database is locked" in out and "stop Hermes and retry" in out, out
    assert not (home / "profiles" / "p").exists()
    code, out = _import(home, "p", source)  # the writer rolled back: the committed rows import
    assert code == 0, out
    assert [e["data"]["content"] for e in _envelopes(home, "p") if e["type"] == "message.appended"] == ["kept"]


def test_a_transcript_of_tool_arguments_escaping_a_lone_surrogate_is_written(tmp_path: Path) -> None:
    """Tool call arguments are JSON text; one that escapes half a surrogate pair (``"\\ud83d"``,
    an emoji cut by a model) decoded, for the indented view, to a lone surrogate, which no UTF-8
    holds: ``export --format md|html`` ended in a traceback (UnicodeEncodeError) and wrote
    nothing. The escape is now kept as the arguments gave it."""
    home = tmp_path / "home"
    with SessionStore.open(home=home, profile="p") as store:
        sid = store.create_session(id="s1")
        store.append_message(sid, "assistant", None, tool_calls=[
            {"id": "c1", "type": "function", "function": {"name": "send", "arguments": '{"text": "hi \\ud83d", "n": 1}'}}])
    for fmt in ("md", "html"):
        out = tmp_path / f"t.{fmt}"
        r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "export", "--format", fmt,
                                      "--session", "s1", str(out)])
        assert r.exit_code == 0, r.output
        text = out.read_text(encoding="utf-8")
        assert '"text": "hi \\ud83d"' in text.replace("&quot;", '"') and "send" in text


def test_a_verbatim_import_another_process_appends_into_is_refused_as_a_conflict(tmp_path: Path) -> None:
    """Another process appending after the import read the log's head made the write fail as
    "imported event N does not continue the chain" (IntegrityError, with a hint to `log verify`
    and the recovery docs: the log is not damaged). It is a ConflictError saying what happened;
    the file goes in as one transaction, so nothing of it was written."""
    lines, _ = _export_of_more_than_a_chunk(tmp_path / "src")
    target = tmp_path / "dst"

    with EventLog.open(target, durability="nosync") as dst:
        real = dst.append_sealed

        def another_process_appends_first(raws: list[bytes]) -> int:
            _another_process_appends(target)
            return real(raws)

        dst.append_sealed = another_process_appends_first  # type: ignore[method-assign]
        with pytest.raises(ConflictError, match="another process appended") as err:
            import_jsonl(dst, lines, onto_other_history=False)
        assert "nothing was imported" in str(err.value)
        assert dst.head()[0] == 1 and dst.verify().ok


def test_an_export_given_as_a_pipe_path_is_imported_whole(tmp_path: Path) -> None:
    """``eventlog import <(zcat export.jsonl.gz)`` (or ``/dev/stdin``): the import peeked at the
    file's first 16 bytes to tell a SQLite database from an export, then opened it again; a pipe
    has no second reading, so its first line arrived without its first 16 bytes and the import
    was refused ("line 1: not a JSON object"). A pipe is read once, from its start."""
    with EventLog.open(tmp_path / "src", durability="nosync") as src:
        src.append([{"type": "session.created", "session": "s", "data": {}}])
        src.append([{"type": "message.appended", "session": "s", "data": {"role": "user", "content": "hello"}}])
        out = io.BytesIO()
        export_jsonl(src, out)
        head = src.head()
    home = tmp_path / "home"
    r, w = os.pipe()
    try:
        os.write(w, out.getvalue())  # a small export: the pipe's buffer holds it
        os.close(w)
        done = subprocess.run([sys.executable, "-c", "from eventlog.cli import main; main()", "--home", str(home),
                               "--profile", "p", "import", f"/dev/fd/{r}"], pass_fds=(r,), capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    finally:
        os.close(r)
    assert done.returncode == 0, done.stderr
    assert "mode=verbatim read=2 imported=2" in done.stdout
    with EventLog.open(home / "profiles" / "p" / "log") as lg:
        assert lg.head() == head


@pytest.mark.parametrize("blob", [False, True], ids=["text", "blob"])
def test_hermes_a_session_whose_row_exceeds_one_event_keeps_a_cut_system_prompt(tmp_path: Path, blob: bool) -> None:
    """A sessions row larger than one event (a 17 MiB system prompt) was skipped whole while its
    title and messages were appended to its stream: the session never showed, its messages were
    unreachable, and every later import of the file was refused ("holds sessions whose ids this
    profile uses for other sessions"). The row now keeps the part of the prompt that fits,
    warned, like a message's content. A BLOB (SQLite lets any column hold one: a prompt written
    as bytes) was not cut at first and the row was skipped: it keeps the first bytes that fit."""
    source = tmp_path / "state.db"
    text = "You are helpful.\x00" * ((17 << 20) // 17)
    prompt: str | bytes = text.encode() if blob else text
    with v22(source) as conn:
        conn.execute("INSERT INTO sessions (id, source, started_at, title, system_prompt) VALUES ('a', 'cli', 1.0, "
                     "'Big', ?)", (prompt,))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('a', 'user', 'hello', 1.5)")
    conn.close()
    home = tmp_path / "home"
    code, out = _import(home, "p", source)
    assert code == 0 and "cut: system_prompt" in out and ("(a BLOB)" in out) == blob, out
    with SessionStore.open(home=home, profile="p") as store:
        a = store.get_session("a")
        assert a is not None and a["title"] == "Big"
        assert [m["content"] for m in store.get_messages("a")] == ["hello"]
    created = [e["data"] for e in _envelopes(home, "p") if e["type"] == "session.created"]
    kept = created[0]["system_prompt"]  # type: ignore[index]
    if blob:
        kept = base64.b64decode(kept["$b"])  # type: ignore[index]
    assert len(created) == 1 and len(kept) >= 8 << 20 and prompt.startswith(kept)  # type: ignore[arg-type]
    code, out = _import(home, "p", source)  # the same file again: nothing new, nothing refused
    assert code == 0 and "events=0 " in out, out


def test_hermes_pin_and_hide_state_of_a_source_that_has_them_is_imported(tmp_path: Path) -> None:
    """Issue 5 asks the import for each session's "titles, parents, archive and pin state".
    Since the lossless mapping of Hermes 0.19 (whose schema has no ``pinned`` or ``hidden``), a
    source with those columns (an older schema, as tests/fixtures_hermes builds) lost them:
    pinned sessions imported unpinned, hidden ones shown. They are flags again; a second import
    appends nothing."""
    source = tmp_path / "state.db"
    make_current(source)  # cron_job.daily is pinned; parent-late is hidden (child-early is in its lineage)
    home = tmp_path / "home"
    code, out = _import(home, "p", source)
    assert code == 0, out
    with SessionStore.open(home=home, profile="p") as store:
        flags = {s["id"]: (s["pinned"], s["hidden"]) for s in store.list_sessions(archived=None, hidden=None)}
    assert flags["cron_job.daily"] == (True, False)
    assert flags["parent-late"] == (False, True) and flags["child-early"] == (False, True)
    assert flags["20250101_100000_aaaa"] == (False, False)
    code, out = _import(home, "p", source)
    assert code == 0 and "events=0 " in out, out


def test_a_plain_event_line_whose_type_is_not_text_is_a_validation_error(tmp_path: Path) -> None:
    """A plain-events line (no seq, prev or hash) with a ``v`` and a ``type`` that is a list or an
    object ended ``eventlog import`` in a traceback (TypeError: unhashable type) while its
    version was looked up. It is refused as any unknown type is, naming the line, and nothing
    is imported."""
    home = tmp_path / "home"
    for n, etype in enumerate(([], {"a": 1})):
        f = tmp_path / f"plain{n}.jsonl"
        f.write_text('{"type":"session.created","session":"s","data":{},"id":"e0"}\n'
                     + '{"type":%s,"v":1,"session":"s","data":{},"id":"e1"}\n' % json.dumps(etype))
        r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "import", str(f)])
        assert r.exit_code == 1 and "invalid line 2.type: unknown event type" in r.output, r.output
        assert not (home / "profiles" / "p").exists()


def test_hermes_usage_rows_sharing_a_key_in_an_older_table_are_all_imported(tmp_path: Path) -> None:
    """An older ``session_model_usage`` without Hermes' primary key (or with a NULL route column,
    read as Hermes' default '') can hold two rows of one session, model, route and task. Both got
    the same event id, and the import (and the adapter's switch) failed whole with "the same
    event id appears twice in one batch" -- after earlier batches were stored, on a large file.
    Each row is now a usage record of its own (warned), so the session's totals are the
    source's; a second import appends nothing."""
    source = tmp_path / "state.db"
    with v22(source) as conn:
        conn.execute("DROP TABLE session_model_usage")
        conn.execute("CREATE TABLE session_model_usage (session_id TEXT, model TEXT, billing_provider TEXT, "
                     "task TEXT, api_call_count INTEGER, input_tokens INTEGER)")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('a', 'cli', 1.0)")
        conn.executemany("INSERT INTO session_model_usage VALUES (?, ?, ?, ?, ?, ?)", [
            ("a", "m", None, "", 1, 10), ("a", "m", "", "", 2, 20), ("a", "m", "", "", 4, 40)])
    conn.close()
    home = tmp_path / "home"
    code, out = _import(home, "p", source)
    assert code == 0 and "usage row 2 has the session, model, route and task of an earlier row" in out, out
    with SessionStore.open(home=home, profile="p") as store:
        usage = store.get_usage("a")
    assert [(u["model"], u["input_tokens"], u["records"]) for u in usage] == [("m", 70, 3)]
    code, out = _import(home, "p", source)
    assert code == 0 and "events=0 " in out, out


def test_hermes_a_source_a_crashed_writer_left_a_hot_journal_is_imported_as_committed(tmp_path: Path) -> None:
    """A writer killed mid-transaction in rollback-journal mode leaves a hot journal. The read-only
    open cannot roll it back ("attempt to write a readonly database"), and the import was
    refused with a hint to check permissions or stop Hermes and retry, which never helped. The
    database and its journal are now copied and the copy rolled back: the committed rows import,
    the uncommitted ones do not, and the source's files are left byte for byte."""
    source = tmp_path / "state.db"
    with v22(source) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('a', 'cli', 1.0)")
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('a', 'user', 'kept', 2.0)")
    conn.close()
    writer = subprocess.Popen([sys.executable, "-c", SPILLING_WRITER, str(source)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    writer.kill()
    writer.wait(60)
    journal = tmp_path / "state.db-journal"
    before = (source.read_bytes(), journal.read_bytes())
    home = tmp_path / "home"
    code, out = _import(home, "p", source)
    assert code == 0, out
    assert [e["data"]["content"] for e in _envelopes(home, "p") if e["type"] == "message.appended"] == ["kept"]
    assert (source.read_bytes(), journal.read_bytes()) == before
