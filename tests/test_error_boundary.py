"""One error boundary per subsystem: sqlite3, OS and value errors leave the projections' reads and
sqlite_export's exports/imports as EventLogError subclasses, cause chained, hint kept.

The mappings are checked as tables (projections.db.converted, sqlite_export.errors.converted),
then on real files: a garbage projection file, a directory where a file should be, a foreign
SQLite file, an export written to /dev/full.
"""
from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import (
    DiskFullError,
    EventLogError,
    ProjectionError,
    StorageError,
    ValidationError,
)
from eventlog.log import EventLog
from eventlog.log.memory import MemoryLog
from eventlog.sessions.store import SessionStore
from projections import db as projection_db
from projections.queries import Reader
from sqlite_export import errors as export_errors
from sqlite_export.hermes import import_hermes
from sqlite_export.jsonl import export_jsonl, import_jsonl

MAPPED = ValidationError("limit", "must be an integer")


@pytest.mark.parametrize("error, cls, hint", [
    (sqlite3.OperationalError("database or disk is full"), DiskFullError, "free some disk space"),
    (OSError(errno.ENOSPC, "No space left on device"), DiskFullError, "free some disk space"),
    (sqlite3.OperationalError("database is locked"), ProjectionError, "retry"),
    (sqlite3.DatabaseError("file is not a database"), ProjectionError, "eventlog doctor --fix"),
    (sqlite3.ProgrammingError("Cannot operate on a closed database."), ProjectionError, "eventlog doctor --fix"),
    (PermissionError(errno.EACCES, "Permission denied", "/p/state.db"), ProjectionError, "belong to this user"),
    (ValueError("embedded null character"), ProjectionError, "eventlog doctor --fix"),
    (MAPPED, ValidationError, None),
])
def test_projection_errors_map_as_a_table(error: BaseException, cls: type, hint: str | None) -> None:
    got = projection_db.converted(error, "reading the projection")
    assert type(got) is cls
    if error is MAPPED:
        assert got is error
        return
    assert str(got).startswith("reading the projection failed: ")
    assert hint is not None and got.hint is not None and hint in got.hint


@pytest.mark.parametrize("error, cls, hint", [
    (sqlite3.DatabaseError("file is not a database"), StorageError, "sqlite3 FILE .tables"),
    (sqlite3.DatabaseError("database disk image is malformed"), StorageError, "sqlite3 FILE .tables"),
    (sqlite3.OperationalError("database or disk is full"), DiskFullError, "free some disk space"),
    (OSError(errno.ENOSPC, "No space left on device"), DiskFullError, "free some disk space"),
    (sqlite3.OperationalError("unable to open database file"), StorageError, "permissions"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), StorageError, "accessible"),
    (ValueError("I/O operation on closed file."), StorageError, "eventlog doctor"),  # the class default
    (MAPPED, ValidationError, None),
])
def test_export_errors_map_as_a_table(error: BaseException, cls: type, hint: str | None) -> None:
    got = export_errors.converted(error, "writing the export")
    assert type(got) is cls
    if error is MAPPED:
        assert got is error
        return
    assert str(got).startswith("writing the export failed: ")
    assert got.hint == hint if hint is None else (got.hint is not None and hint in got.hint)


def _chained(info: pytest.ExceptionInfo[Any], cause: type) -> None:
    assert isinstance(info.value, EventLogError)
    assert isinstance(info.value.__cause__, cause), repr(info.value.__cause__)


def test_a_garbage_projection_file_is_a_projection_error(tmp_path: Path) -> None:
    junk = tmp_path / "audit.db"
    junk.write_bytes(b"not a database, just bytes " * 400)
    with Reader.open_file(junk) as reader, pytest.raises(ProjectionError) as info:
        reader.stats()
    _chained(info, sqlite3.DatabaseError)
    assert str(junk) in str(info.value) and "eventlog doctor --fix" in str(info.value)


def test_a_directory_in_place_of_a_projection_file_is_a_projection_error(tmp_path: Path) -> None:
    (tmp_path / "audit.db").mkdir()
    with Reader.open_file(tmp_path / "audit.db") as reader, pytest.raises(ProjectionError) as info:
        reader.list_sessions()
    _chained(info, sqlite3.Error)


def test_a_foreign_sqlite_file_is_refused_by_name(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with Reader.open_file(other) as reader, pytest.raises(ProjectionError, match="not an eventlog projection"):
        reader.get_session("s1")
    with pytest.raises(ValidationError) as bad:
        Reader()
    assert bad.value.field == "path"


def test_a_junk_hermes_source_is_a_storage_error_with_its_cause(tmp_path: Path) -> None:
    from eventlog.sessions.store import SessionStore

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    with SessionStore.open(tmp_path / "home", "p", read_model="fold", durability="nosync") as store:
        with pytest.raises(StorageError) as info:
            import_hermes(store, junk)
        _chained(info, sqlite3.DatabaseError)
        assert info.value.hint is not None and store.log.head()[0] == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_an_export_to_a_full_disk_is_a_disk_full_error() -> None:
    log = MemoryLog(profile="p")
    log.append([{"type": "note.added", "session": "s1", "data": {"text": "x" * 100}}])
    with open("/dev/full", "wb", buffering=0) as out, pytest.raises(DiskFullError) as info:
        export_jsonl(log, out)
    _chained(info, OSError)
    assert "writing the export failed" in str(info.value)


def test_an_import_keeps_its_own_validation_errors() -> None:
    """A ValidationError is a ValueError too: the boundary passes it through unchanged."""
    log = MemoryLog(profile="p")
    with pytest.raises(ValidationError) as bad:
        import_jsonl(log, ['{"type": "x"', "{}"])
    assert bad.value.field == "line 1"
    with pytest.raises(ValidationError) as surrogate:
        import_jsonl(log, ["\ud800"])
    assert surrogate.value.field == "line 1" and "surrogate" in surrogate.value.problem
    assert log.head()[0] == 0


def test_every_error_class_has_a_hint(tmp_path: Path) -> None:
    """The README's promise: every error derives from EventLogError and has a hint — the ones a
    store raises for everyday mistakes included (they had none: found by an outside audit)."""
    import inspect

    from eventlog import SessionStore, errors
    from eventlog.errors import NotFoundError

    args: dict[str, tuple[Any, ...]] = {
        "ValidationError": ("field", "problem"), "ProfileNameError": ("profile", "bad"),
        "EventTooLargeError": ("data", "too big"), "ConcurrencyError": ("s", 1, 2), "HeadMovedError": (1, 2),
        "NotFoundError": ("widget", "w1"), "ConflictError": ("field", "problem"), "EarlierProcessError": ("log", "p"),
        "TitleConflictError": ("t", "s1"), "DuplicateEventError": ("id", 3),
        "WriterBusyError": ("/x", None, 1.0), "ForkedEnvironmentError": (),
        "OutcomeUnknownError": ("append: the connection was lost after COMMIT", ["id-1"]),
    }
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, EventLogError) and c is not EventLogError]
    assert len(classes) >= 15
    for cls in classes:
        e = cls(*args.get(cls.__name__, ("something failed",)))
        assert e.hint, f"{cls.__name__} has no hint"
        assert str(e).endswith(f"(hint: {e.hint})")
    with SessionStore.open(tmp_path, "p") as store:
        sid = store.create_session(source="cli")
        for call in (lambda: store.append_message("nope", "user", "x"), lambda: store.react(999, author="a", emoji="👍"),
                     lambda: store.append_message(sid, "wizard", "x")):
            with pytest.raises(EventLogError) as info:
                call()
            assert info.value.hint
        with pytest.raises(NotFoundError) as nf:
            store.set_title("nope", "a title")
        assert "list_sessions" in (nf.value.hint or "")


@pytest.mark.parametrize("url, secret", [
    ("postgresql://postgres:pw-xyz@host:5432/db", "pw-xyz"),
    ("postgresql://postgres@127.0.0.1:5432/db?password=pw-xyz", "pw-xyz"),
    ("postgresql://h/db?sslmode=require&password=pw-xyz&connect_timeout=3", "pw-xyz"),
    ("postgresql://postgres:SEC/RET7@h/db", "RET7"),
    ("postgresql://postgres:SEC@RET6@h/db", "RET6"),
    ('end of string reached in URI: "postgresql://postgres:pw-xyz@[::1/postgres"', "pw-xyz"),
    ("host=h user=u password=pw-xyz dbname=d", "pw-xyz"),
])
def test_no_password_reaches_a_message(url: str, secret: str) -> None:
    """A password in a ?password= parameter, one holding a raw / or @, and a URL quoted inside a
    libpq message were printed as they were (found by an outside audit)."""
    pytest.importorskip("psycopg")
    from eventlog.log.pg_schema import redact, storage_error

    assert secret not in redact(url) and "***" in redact(url)
    assert secret not in str(storage_error(ValueError(url), "cannot open the log", redact(url)))
    assert redact("postgresql://u@h:5432/db") == "postgresql://u@h:5432/db"


@pytest.mark.parametrize("url, secret", [
    ("postgresql://postgres:SEC@RET6@127.0.0.1:1/db", "RET6"),  # libpq resolved host 'RET6@127.0.0.1'
    ("host=127.0.0.1 port=1 user=u password=pw-xyz dbname=d", "pw-xyz"),  # taken for a path, echoed whole
    ("password = 'pw xyz' host=127.0.0.1", "pw xyz"),
    ("postgresql://postgres:pw-xyz@127.0.0.1:1/db", "pw-xyz"),
    # raw characters the redaction could not see past (outside audit: printed whole)
    ("postgresql://postgres:SEC?RETN@127.0.0.1:1/db", "RETN"),
    ("postgresql://postgres:SEC RETO@127.0.0.1:1/db", "RETO"),
    ('postgresql://postgres:SEC"RETQ@127.0.0.1:1/db', "RETQ"),
    ("postgresql://postgres:SEC'RETS@127.0.0.1:1/db", "RETS"),
    ("postgresql://postgres:SEC<RETL>@127.0.0.1:1/db", "RETL"),
])
def test_no_password_reaches_the_cli_output(tmp_path: Path, url: str, secret: str) -> None:
    """Through the command a user types (found by an outside audit: the two first leaked)."""
    pytest.importorskip("psycopg")
    from click.testing import CliRunner

    from eventlog.cli import main

    r = CliRunner().invoke(main, ["--home", str(tmp_path), "--log-url", url, "sessions", "list"])
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert secret not in r.stdout + r.stderr, r.stderr
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "sessions", "list"], env={"EVENTLOG_LOG_URL": url})
    assert r.exit_code == 1 and secret not in r.stdout + r.stderr, r.stderr


_BAD_CALLS = {
    "read from a seq past 64 bits": lambda lg, store, d: list(lg.read(2**70)),
    "read up to a seq past 64 bits": lambda lg, store, d: list(lg.read(1, 2**70)),
    "read_session after past 64 bits": lambda lg, store, d: list(lg.read_session("s1", after=2**70)),
    "follow from past 64 bits": lambda lg, store, d: list(lg.follow(2**70, timeout=0.05)),
    "get past 64 bits": lambda lg, store, d: lg.get(-(2**70)),
    "read_session of a lone surrogate": lambda lg, store, d: list(lg.read_session("\ud800")),
    "event_seq of a lone surrogate": lambda lg, store, d: lg.event_seq("\ud800"),
    "a log path with a lone surrogate": lambda lg, store, d: EventLog.open(d / "\ud800"),
    "a home with a lone surrogate": lambda lg, store, d: SessionStore.open(home=d / "\ud800"),
    "a snapshot path with a NUL": lambda lg, store, d: store.snapshot(d / "x\x00y.db"),
    "a snapshot path with a lone surrogate": lambda lg, store, d: store.snapshot(d / "\ud800.db"),
}


@pytest.mark.parametrize("call", sorted(_BAD_CALLS))
def test_bad_python_input_is_an_eventlog_error(tmp_path: Path, call: str) -> None:
    """An outside audit fuzzed the Python surface: these raised OverflowError, UnicodeEncodeError
    or ValueError, which the README's 'every error derives from EventLogError' rules out."""
    with SessionStore.open(tmp_path, follower=False) as store:
        store.create_session("s1")
        with pytest.raises(ValidationError):
            _BAD_CALLS[call](store.log, store, tmp_path)
        assert store.log.head()[0] == 1


def test_cli_paths_that_are_not_utf8_are_one_line_errors(tmp_path: Path) -> None:
    """Undecodable bytes in --home, --out or --to reached LMDB or SQLite as a traceback, and
    `init` left a half-made profile behind (outside audit); a home that is a file named --home
    when it came from $EVENTLOG_HOME."""
    import subprocess
    import sys

    exe = os.fsencode(Path(sys.executable).with_name("eventlog"))
    base = os.fsencode(tmp_path)
    bad = base + b"/a\xffb"
    home = base + b"/h"
    assert subprocess.run([exe, b"--home", home, b"init"], capture_output=True).returncode == 0
    for args, code in (([b"--home", bad, b"init"], 2), ([b"--home", home, b"replay", b"--until", b"1", b"--out", bad], 1),
                       ([b"--home", home, b"log", b"copy", b"--to", bad], 1)):
        r = subprocess.run([exe, *args], capture_output=True)
        assert r.returncode == code and b"Traceback" not in r.stderr and b"not valid UTF-8" in r.stderr, r.stderr
    assert not os.path.exists(bad)
    afile = tmp_path / "afile"
    afile.write_text("")
    r = subprocess.run([exe, b"sessions", b"list"], capture_output=True, env=dict(os.environ, EVENTLOG_HOME=str(afile)))
    assert r.returncode == 2 and b"Invalid value for $EVENTLOG_HOME" in r.stderr, r.stderr


def test_a_refused_postgresql_open_leaves_no_local_profile(tmp_path: Path) -> None:
    """A read or write whose server refused the open (unreachable, wrong password, no such
    profile) left an empty profiles/<name>/ in the home (outside audit)."""
    pytest.importorskip("psycopg")
    from click.testing import CliRunner

    from eventlog.cli import main

    url = "postgresql://u:pw@127.0.0.1:1/db"
    for args in (["sessions", "list"], ["messages", "add", "s1", "--role", "user", "--content", "hi"]):
        r = CliRunner().invoke(main, ["--home", str(tmp_path), "--log-url", url, "--profile", "X", *args])
        assert r.exit_code == 1 and "cannot reach PostgreSQL" in r.stderr, r.stderr
        assert not (tmp_path / "profiles" / "X").exists()


def test_compact_on_a_log_that_does_not_compact_is_not_called_invalid_input(tmp_path: Path) -> None:
    """On PostgreSQL (and the memory log) `compact` said 'invalid log': nothing the user gave was
    invalid; the backend does not compact (outside audit)."""
    from eventlog.errors import ConflictError

    with SessionStore.open(tmp_path, log=MemoryLog(profile="default"), follower=False) as store:
        with pytest.raises(ConflictError) as e:
            store.compact()
    assert str(e.value).startswith("log: this log backend does not compact") and "VACUUM" in str(e.value.hint)


def test_an_unknown_outcome_on_the_command_line_names_its_event_ids(capsys: pytest.CaptureFixture[str]) -> None:
    """OutcomeUnknownError asks for the events to be appended again under their ids; on the
    command line the ids (generated ones too) were printed nowhere, and running the command
    again appended them anew under new ids (second-round audit, helper-57)."""
    from eventlog.cli.common import handled
    from eventlog.errors import OutcomeUnknownError

    @handled
    def command() -> None:
        raise OutcomeUnknownError("append was cut off", ["01JA", "01JB"])

    with pytest.raises(SystemExit) as exit_:
        command()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "event ids, in order: 01JA 01JB" in err and "eventlog append" in err
