"""`eventlog import --format hermes` into a profile that already holds something, and again after
Hermes changed the file: what the profile shows afterwards is what Hermes shows (outside audit,
helper-49: merged sessions, half imports, stale titles and ends, inactive messages shown, the CLI
skipping Hermes' migrations).

Sources are written by Hermes' own ``SessionDB`` where hermes-agent is installed, else by
:class:`Hermes`, which writes Hermes' v22 schema (eventlog's copy of its DDL) the way those
methods do; every test passes either way."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from eventlog.cli import main
from eventlog.errors import ConflictError, StorageError
from eventlog.log.memory import MemoryLog
from eventlog.sessions.store import SessionStore
from sqlite_export.hermes import import_hermes

sys.path.insert(0, str(Path(__file__).parent))
from test_hermes_import import fingerprint, project, v22  # noqa: E402

try:
    import hermes_state
except ImportError:  # the default suite: no Hermes installed
    hermes_state = None


class Hermes:
    """The Hermes methods these tests need, on a state.db at ``path``: Hermes' own when it is
    installed, else the same statements on its v22 schema."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if hermes_state is not None:
            real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
            self.db: Any = real(db_path=path)
            self.conn = None
        else:
            self.db = None
            self.conn = v22(path) if not path.exists() else sqlite3.connect(path)
            self.conn.isolation_level = None
            self.conn.execute("PRAGMA synchronous = OFF")  # each call commits, as in Hermes; the tests need no fsync

    def __enter__(self) -> "Hermes":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.db is not None:
            self.db.close()
        else:
            assert self.conn is not None
            self.conn.close()

    def _sql(self, sql: str, *args: Any) -> sqlite3.Cursor:
        assert self.conn is not None
        return self.conn.execute(sql, args)

    def create_session(self, sid: str, source: str = "cli") -> None:
        if self.db is not None:
            self.db.create_session(sid, source)
        else:
            self._sql("INSERT INTO sessions (id, source, started_at) VALUES (?, ?, ?)", sid, source, time.time())

    def append_message(self, sid: str, role: str, content: str) -> int:
        if self.db is not None:
            return int(self.db.append_message(sid, role, content))
        cur = self._sql("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                        sid, role, content, time.time())
        self._sql("UPDATE sessions SET message_count = message_count + 1 WHERE id = ?", sid)
        return int(cur.lastrowid or 0)

    def set_session_title(self, sid: str, title: str) -> None:
        if self.db is not None:
            self.db.set_session_title(sid, title)
            return
        title = title.strip()
        if title and self._sql("SELECT 1 FROM sessions WHERE title = ? AND id != ?", title, sid).fetchone():
            raise ValueError(f"Title '{title}' is already in use")
        self._sql("UPDATE sessions SET title = ? WHERE id = ?", title or None, sid)

    def end_session(self, sid: str, reason: str) -> None:
        if self.db is not None:
            self.db.end_session(sid, reason)
        else:
            self._sql("UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                      time.time(), reason, sid)

    def reopen_session(self, sid: str) -> None:
        if self.db is not None:
            self.db.reopen_session(sid)
        else:
            self._sql("UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = ?", sid)

    def archive_and_compact(self, sid: str, summary: str) -> None:
        if self.db is not None:
            self.db.archive_and_compact(sid, [{"role": "user", "content": summary}])
            return
        self._sql("UPDATE messages SET active = 0, compacted = 1 WHERE session_id = ? AND active = 1", sid)
        self.append_message(sid, "user", summary)

    def rewind_to_message(self, sid: str, message_id: int) -> None:
        if self.db is not None:
            self.db.rewind_to_message(sid, message_id)
        else:
            self._sql("UPDATE messages SET active = 0 WHERE session_id = ? AND id >= ? AND active = 1", sid, message_id)

    def delete_session(self, sid: str) -> None:
        if self.db is not None:
            self.db.delete_session(sid)
        else:
            self._sql("DELETE FROM messages WHERE session_id = ?", sid)
            self._sql("DELETE FROM sessions WHERE id = ?", sid)

    def shown(self, sid: str) -> list[Any]:
        """The contents of the messages Hermes shows for ``sid``."""
        if self.db is not None:
            return [m["content"] for m in self.db.get_messages(sid)]
        return [r[0] for r in self._sql("SELECT content FROM messages WHERE session_id = ? AND active = 1"
                                        " ORDER BY id", sid)]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    (tmp_path / "hermes").mkdir()
    return tmp_path / "hermes" / "state.db"


@pytest.fixture(params=["memory", "store"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Where an import goes: a bare log, or a profile read through its projection."""
    if request.param == "memory":
        yield MemoryLog()
        return
    with SessionStore.open(tmp_path / "home", "p", durability="nosync") as store:
        yield store


def shown(target: Any, sid: str) -> dict[str, Any]:
    """The session as eventlog shows it, and the contents of its messages."""
    store = target if isinstance(target, SessionStore) else None
    if store is None:
        from eventlog.sessions.store import FoldReadModel

        reads: Any = FoldReadModel(target)
    else:
        store.sync()
        reads = store
    s = reads.get_session(sid)
    return {"title": s["title"], "ended": (s["ended_at"] is not None, s["end_reason"]),
            "messages": [m["content"] for m in reads.get_messages(sid)], "count": s["message_count"]}


def head(target: Any) -> int:
    return int(getattr(target, "log", target).head()[0])


# ---- A: never onto another history --------------------------------------------------------------

def test_a_session_id_the_profile_uses_refuses_the_import(tmp_path: Path, source: Path) -> None:
    with SessionStore.open(tmp_path / "home", "p", durability="nosync") as store:
        store.create_session("chat-1", title="My eventlog chat", source="gateway")
        store.append_message("chat-1", "user", "eventlog's own words")
        with Hermes(source) as h:
            h.create_session("chat-1", "telegram")
            h.set_session_title("chat-1", "Hermes chat")
            h.append_message("chat-1", "user", "a different conversation from Hermes")
            h.create_session("other")
        before = store.log.head()
        with pytest.raises(ConflictError) as err:
            import_hermes(store, source)
        assert "'chat-1'" in str(err.value) and str(source) in str(err.value) and "'other'" not in str(err.value)
        assert store.log.head() == before  # nothing written, not even the session that did not collide
        assert shown(store, "chat-1") == {"title": "My eventlog chat", "ended": (False, None),
                                          "messages": ["eventlog's own words"], "count": 1}
        # An id the profile used once and deleted is still another history.
        store.delete_session("chat-1")
        with pytest.raises(ConflictError):
            import_hermes(store, source)
        assert store.log.head()[0] == before[0] + 1


def test_the_same_id_from_another_hermes_database_is_refused(target: Any, tmp_path: Path, source: Path) -> None:
    with Hermes(source) as h:
        h.create_session("cron_job.daily")
        h.append_message("cron_job.daily", "user", "from the first machine")
    import_hermes(target, source)
    other = tmp_path / "other" / "state.db"
    other.parent.mkdir()
    time.sleep(0.01)  # another session: another start
    with Hermes(other) as h:
        h.create_session("cron_job.daily")
        h.append_message("cron_job.daily", "user", "from the second machine")
    n = head(target)
    with pytest.raises(ConflictError, match="cron_job.daily"):
        import_hermes(target, other)
    assert head(target) == n


def test_a_session_deleted_here_after_its_import_is_left_alone(tmp_path: Path, source: Path) -> None:
    with Hermes(source) as h:
        for sid in ("keep", "drop"):
            h.create_session(sid)
            h.append_message(sid, "user", f"first words of {sid}")
    with SessionStore.open(tmp_path / "home", "p", durability="nosync") as store:
        import_hermes(store, source)
        store.delete_session("drop")
        with Hermes(source) as h:
            for sid in ("keep", "drop"):
                h.append_message(sid, "user", f"later words of {sid}")
        n = store.log.head()[0]
        report = import_hermes(store, source)
        assert (report.deleted_here, report.messages) == (1, 1)
        assert any("'drop' was imported before and has since been deleted" in w for w in report.warnings)
        assert {e["session"] for e in store.log.read(n + 1)} == {"keep", None}  # (None: Hermes' message counter)
        assert store.get_session("drop") is None


def test_cli_refuses_a_colliding_import_in_one_line(tmp_path: Path, source: Path) -> None:
    home = tmp_path / "home"
    with SessionStore.open(home, "p", durability="nosync") as store:
        store.create_session("chat-1")
    with Hermes(source) as h:
        h.create_session("chat-1")
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "import", "--format", "hermes", str(source)])
    assert r.exit_code == 1 and "chat-1" in r.output and "nothing was imported" in r.output, r.output
    with SessionStore.open(home, "p", durability="nosync") as store:
        assert store.log.head()[0] == 1


# ---- B: the whole source is read before anything is appended -------------------------------------

def damage_a_messages_page(path: Path) -> None:
    """Overwrite a leaf page of the messages table half way (in a child process: no plain file
    I/O on a database in this one)."""
    conn = sqlite3.connect(path)
    try:
        pages = [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf'"
                                            " ORDER BY pageno")]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table")
    finally:
        conn.close()
    victim = pages[len(pages) // 2]
    subprocess.run([sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'r+b') as f:\n"
                    "    f.seek(int(sys.argv[2])); f.write(b'\\xff' * int(sys.argv[3]))",
                    str(path), str((victim - 1) * size), str(size)], check=True)


@pytest.fixture
def damaged(source: Path) -> Path:
    with Hermes(source) as h:
        for s in range(20):
            h.create_session(f"s{s}")
            for i in range(100):
                h.append_message(f"s{s}", "user", f"message {s}/{i} " + "x" * 200)
    conn = sqlite3.connect(source)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    damage_a_messages_page(source)
    return source


def test_a_damaged_source_appends_nothing_and_is_named(target: Any, damaged: Path) -> None:
    before = fingerprint(damaged)
    with pytest.raises(StorageError) as err:
        import_hermes(target, damaged)
    assert str(damaged) in str(err.value) and "nothing was imported" in str(err.value)
    assert err.value.hint is not None and "source file is damaged, not this profile" in err.value.hint
    assert head(target) == 0
    assert fingerprint(damaged) == before


def test_cli_a_damaged_source_leaves_no_profile(tmp_path: Path, damaged: Path) -> None:
    home = tmp_path / "home"
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "new", "import", "--format", "hermes", str(damaged)])
    assert r.exit_code == 1 and str(damaged) in r.output and "source file is damaged" in r.output, r.output
    assert not (home / "profiles" / "new").exists()


def test_cli_an_import_that_fails_part_way_leaves_no_profile_it_created(tmp_path: Path, source: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """After the source was read whole, an append can still fail (a full disk): the profile the
    import created goes with it, as the help says."""
    import sqlite_export.hermes as hermes

    with Hermes(source) as h:
        for s in range(3):
            h.create_session(f"s{s}")
            for i in range(200):
                h.append_message(f"s{s}", "user", f"message {i}")
    real = hermes.append_batch
    calls = []

    def failing(log: Any, batch: list[dict[str, Any]], report: Any) -> int:
        calls.append(len(batch))
        if len(calls) == 2:
            raise StorageError("disk full (simulated)")
        return real(log, batch, report)

    monkeypatch.setattr(hermes, "append_batch", failing)
    home = tmp_path / "home"
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "new", "import", "--format", "hermes", str(source)])
    assert r.exit_code == 1 and "disk full" in r.output and calls[0] > 0, r.output
    assert not (home / "profiles" / "new").exists()
    # Into a profile that was there before, nothing of it is removed.
    with SessionStore.open(home, "old", durability="nosync") as store:
        store.create_session("mine")
    calls.clear()
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "old", "import", "--format", "hermes", str(source)])
    assert r.exit_code == 1
    with SessionStore.open(home, "old", durability="nosync") as store:
        assert store.get_session("mine") is not None


# ---- C: a later import brings titles and ends to what Hermes shows now ----------------------------

def test_renamed_back_reopened_and_ended_again(target: Any, source: Path) -> None:
    with Hermes(source) as h:
        h.create_session("s1")
        h.append_message("s1", "user", "hi")
        h.set_session_title("s1", "Alpha")
        h.end_session("s1", "done")
    import_hermes(target, source)
    with Hermes(source) as h:
        h.set_session_title("s1", "Beta")
    assert import_hermes(target, source).updates == 1
    assert shown(target, "s1")["title"] == "Beta"
    with Hermes(source) as h:
        h.set_session_title("s1", "Alpha")
        h.reopen_session("s1")
    report = import_hermes(target, source)
    assert (report.updates, report.changed, report.warning_count) == (2, 0, 0), report
    assert shown(target, "s1")["title"] == "Alpha" and shown(target, "s1")["ended"] == (False, None)
    n = head(target)
    again = import_hermes(target, source)
    assert (again.events, head(target)) == (0, n)  # idempotent
    with Hermes(source) as h:
        h.end_session("s1", "user_exit")
    assert import_hermes(target, source).updates == 1
    assert shown(target, "s1")["ended"] == (True, "user_exit")
    assert import_hermes(target, source).events == 0


def test_titles_swapped_between_two_sessions(target: Any, source: Path) -> None:
    with Hermes(source) as h:
        for sid, title in (("s1", "Alpha"), ("s2", "Beta"), ("s3", "Gamma")):
            h.create_session(sid)
            h.set_session_title(sid, title)
    import_hermes(target, source)
    with Hermes(source) as h:  # s1 and s2 swap; s3 goes round through a third title
        h.set_session_title("s1", "Tmp")
        h.set_session_title("s2", "Alpha")
        h.set_session_title("s1", "Beta")
    report = import_hermes(target, source)
    assert report.warning_count == 0, report.warnings
    assert [shown(target, s)["title"] for s in ("s1", "s2", "s3")] == ["Beta", "Alpha", "Gamma"]
    assert import_hermes(target, source).events == 0
    log = getattr(target, "log", target)
    titles = dict(project(log).execute("SELECT id, title FROM sessions").fetchall())  # Hermes' projection agrees
    assert titles == {"s1": "Beta", "s2": "Alpha", "s3": "Gamma"}


def test_a_cleared_title_and_a_deleted_session_are_reported(target: Any, source: Path) -> None:
    with Hermes(source) as h:
        for sid, title in (("s1", "Alpha"), ("s2", "Beta")):
            h.create_session(sid)
            h.set_session_title(sid, title)
    import_hermes(target, source)
    with Hermes(source) as h:
        h.set_session_title("s1", "")
        h.delete_session("s2")
    report = import_hermes(target, source)
    assert (report.events, report.not_in_source) == (0, 1)
    assert any("'s1': Hermes shows no title; eventlog keeps 'Alpha'" in w for w in report.warnings)
    assert any("1 sessions an earlier import brought are not in this source ('s2')" in w for w in report.warnings)
    assert shown(target, "s2")["title"] == "Beta"  # an import deletes nothing


def test_a_title_held_by_a_session_of_the_profile_is_reported(tmp_path: Path, source: Path) -> None:
    with SessionStore.open(tmp_path / "home", "p", durability="nosync") as store:
        store.create_session("native", title="Plans")
        with Hermes(source) as h:
            h.create_session("s1")
            h.set_session_title("s1", "Plans")
        report = import_hermes(store, source)
        assert any("'s1': its Hermes title 'Plans' is held by session 'native'" in w for w in report.warnings)
        assert shown(store, "s1")["title"] is None and shown(store, "native")["title"] == "Plans"


# ---- D: messages Hermes does not show are not shown ---------------------------------------------

def test_compacted_and_rewound_messages_are_hidden(target: Any, source: Path) -> None:
    with Hermes(source) as h:
        h.create_session("c")
        for i in range(4):
            h.append_message("c", "user" if i % 2 == 0 else "assistant", f"original turn {i}")
        h.archive_and_compact("c", "SUMMARY")
        h.create_session("r")
        ids = [h.append_message("r", "user", f"rewound? {i}") for i in range(3)]
        h.rewind_to_message("r", ids[1])
        h.create_session("u")  # /undo in the middle, then the talk goes on
        ids = [h.append_message("u", "user", f"undo {i}") for i in range(3)]
        h.rewind_to_message("u", ids[1])
        h.append_message("u", "user", "after the undo")
        hermes_shows = {sid: h.shown(sid) for sid in ("c", "r", "u")}
    report = import_hermes(target, source)
    assert report.rewinds == 3
    for sid in ("c", "r", "u"):
        assert shown(target, sid)["messages"] == hermes_shows[sid], sid
        assert shown(target, sid)["count"] == len(hermes_shows[sid])
    assert hermes_shows["c"] == ["SUMMARY"] and hermes_shows["u"] == ["undo 0", "after the undo"]
    reads = target if isinstance(target, SessionStore) else None
    if reads is not None:
        assert [m["message_id"] for m in reads.search("rewound")["results"]] == [
            m["id"] for m in reads.get_messages("r")]
        assert len(reads.get_messages("c", include_inactive=True)) == 5  # the log keeps them
    assert import_hermes(target, source).events == 0


def test_a_compaction_after_the_first_import(target: Any, source: Path) -> None:
    with Hermes(source) as h:
        h.create_session("c")
        for i in range(4):
            h.append_message("c", "user", f"turn {i}")
    import_hermes(target, source)
    with Hermes(source) as h:
        h.archive_and_compact("c", "SUMMARY")
    report = import_hermes(target, source)
    assert (report.rewinds, report.messages, report.changed) == (1, 1, 0), report
    assert shown(target, "c")["messages"] == ["SUMMARY"]
    assert import_hermes(target, source).events == 0


# ---- E: the CLI lets Hermes migrate its copy of the source, as the switch does -------------------

def old_database(path: Path) -> None:
    """A database from before ``session_model_usage`` (schema 16) with token totals in its row."""
    with Hermes(path) as h:
        h.create_session("s")
        h.append_message("s", "user", "hi")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE sessions SET model = 'm', input_tokens = 812, output_tokens = 64,"
                     " estimated_cost_usd = 0.0123 WHERE id = 's'")
        conn.execute("DROP TABLE session_model_usage")
        conn.execute("UPDATE schema_version SET version = 16")
    conn.close()


def test_cli_runs_hermes_migrations_on_its_copy(tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old_database(source)
    before = fingerprint(source)
    if hermes_state is None:  # what Hermes' v17 migration does: usage rows seeded from each session's totals
        usage = v22(tmp_path / "ddl.db").execute("SELECT sql FROM sqlite_master WHERE name = 'session_model_usage'"
                                                 ).fetchone()[0]
        opened: list[Path] = []

        class HermesSessionDB:
            def __init__(self, db_path: Path) -> None:
                opened.append(Path(db_path))
                conn = sqlite3.connect(db_path)
                with conn:
                    conn.execute(usage)
                    conn.execute("INSERT INTO session_model_usage (session_id, model, input_tokens, output_tokens,"
                                 " estimated_cost_usd) SELECT id, model, input_tokens, output_tokens, estimated_cost_usd"
                                 " FROM sessions")
                    conn.execute("UPDATE schema_version SET version = 22")
                conn.close()

            def close(self) -> None:
                pass

        import sqlite_export.hermes

        monkeypatch.setattr(sqlite_export.hermes, "hermes_session_db", lambda: HermesSessionDB)
    home = tmp_path / "home"
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "import", "--format", "hermes", "--json",
                                  str(source)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout[r.stdout.index("{"):])["usage"] == 1
    if hermes_state is None:
        assert len(opened) == 1 and opened[0] != source  # Hermes opened a copy, never the source
    assert fingerprint(source) == before
    with SessionStore.open(home, "p", durability="nosync") as store:
        s = store.get_session("s")
        assert (s["input_tokens"], s["output_tokens"], s["estimated_cost_usd"]) == (812, 64, 0.0123)


def test_without_hermes_an_import_reads_the_file_as_it_is(tmp_path: Path, source: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    old_database(source)
    import sqlite_export.hermes

    monkeypatch.setattr(sqlite_export.hermes, "hermes_session_db", lambda: None)
    home = tmp_path / "home"
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "import", "--format", "hermes", str(source)])
    assert r.exit_code == 0 and "usage=0" in r.output, r.output


def test_progress_covers_both_passes(tmp_path: Path, source: Path) -> None:
    with Hermes(source) as h:
        h.create_session("s")
        for i in range(1500):
            h.append_message("s", "user", f"m{i}")
    seen: list[tuple[int, int]] = []
    import_hermes(MemoryLog(), source, progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (1000, 3002) and seen[-1] == (3002, 3002)


def test_an_error_of_hermes_on_the_copy_is_one_line(tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite_export.hermes

    with Hermes(source) as h:
        h.create_session("s")

    class Broken:
        def __init__(self, db_path: Path) -> None:
            raise RuntimeError("HERMES_HOME is not writable")

    monkeypatch.setattr(sqlite_export.hermes, "hermes_session_db", lambda: Broken)
    home = tmp_path / "home"
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "new", "import", "--format", "hermes", str(source)])
    assert r.exit_code == 1 and "Hermes could not open a copy" in r.output and "HERMES_HOME" in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not (home / "profiles" / "new").exists()


def test_a_later_copy_imported_into_a_switched_home_shows_in_the_facade(tmp_path: Path) -> None:
    """Operator audit (helper-75): a user switched to the facade, wrote through it, went back to
    plain Hermes on the file moved aside, then imported that file into the home
    (`eventlog import --format hermes`). Hermes gave its new session the rowid, its new message
    the id and its session the title the facade had given its own since; the import reported the
    session and message as written and eventlog's view showed them, but the Hermes projection
    ignored both rows (INSERT OR IGNORE), in every rebuild too -- and a message Hermes added to a
    session the facade had written to as well. Now they take free keys there."""
    from eventlog.adapters.hermes import SessionDB

    home = tmp_path / "home"
    home.mkdir()
    with Hermes(home / "state.db") as h:
        h.create_session("old")
        h.append_message("old", "user", "before the switch")
    db = SessionDB(db_path=home / "state.db")
    db.create_session("facade", "cli")
    db.set_session_title("facade", "Shared")
    facade_id = db.append_message("facade", "user", "written through the facade")
    db.append_message("old", "user", "the facade again")
    db.close()
    later = tmp_path / "later" / "state.db"
    later.parent.mkdir()
    shutil.copy(home / "state.db.pre-eventlog", later)
    with Hermes(later) as h:
        h.create_session("downgraded")
        h.set_session_title("downgraded", "Shared")
        assert h.append_message("downgraded", "user", "written by plain Hermes") == facade_id
        h.append_message("old", "user", "plain Hermes again")  # the id of the facade's second message
    out = subprocess.run([sys.executable, "-c", "from eventlog.cli import main; main()", "--home",
                          str(home / "state.db.eventlog"), "import", "--format", "hermes", "--json", str(later)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["sessions"] == 1

    db = SessionDB(db_path=home / "state.db")
    try:
        for _ in range(2):  # caught up, then rebuilt from the log alone
            s = db.get_session("downgraded")
            assert s is not None and s["title"] is None  # the title stays the facade session's
            assert [m["content"] for m in db.get_messages("downgraded")] == ["written by plain Hermes"]
            assert [(m["id"], m["content"]) for m in db.get_messages("facade")] == [
                (facade_id, "written through the facade")]
            assert db.get_session_title("facade") == "Shared"
            assert [m["content"] for m in db.get_messages("old")] == ["before the switch", "the facade again",
                                                                      "plain Hermes again"]
            db._engine.rebuild()  # type: ignore[union-attr]
    finally:
        db.close()
