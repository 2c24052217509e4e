"""A mirror kept current by importing each new export (`eventlog import` continues a log whose
events it holds) or by `eventlog log copy` (a copy resumes after what the target holds) received
a source's `log.erased` record but kept, whole, the events it names — they matched by seq and
hash, so the continuation check passed them. Every read hid the session, `verify` counted nothing
erased, `doctor` saw nothing, and the words stayed in the mirror's files (outside audit,
helper-74). An imported record now replaces by their stubs the events it names that the log
held whole, in the import's transaction, and the CLI compacts and purges after it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from eventlog.cli import main
from eventlog.log.copy import copy_log
from eventlog.log.lmdb import EventLog
from eventlog.log.memory import MemoryLog
from eventlog.sessions.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))
from test_erase import MARKER, traces  # noqa: E402


def cli(home: Path, *args: str) -> str:
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def source(tmp_path: Path) -> tuple[Path, str, str]:
    home = tmp_path / "a"
    with SessionStore.open(home, "p", follower=False) as store:
        secret = store.create_session(source="cli", title="secret")
        for i in range(5):
            store.append_message(secret, "user", f"words {i} {MARKER}")
        kept = store.create_session(source="cli", title="kept")
        store.append_message(kept, "user", "plain")
    return home, secret, kept


def erase_at(home: Path, secret: str, kept: str) -> None:
    with SessionStore.open(home, "p", follower=False) as store:
        store.erase_session(secret, "asked")
        store.append_message(kept, "user", "after the erase")


def test_an_import_that_continues_a_mirror_takes_the_erased_words_out_of_it(tmp_path: Path) -> None:
    home, secret, kept = source(tmp_path)
    mirror = tmp_path / "mirror"
    cli(home, "export", str(tmp_path / "1.jsonl"))
    cli(mirror, "import", str(tmp_path / "1.jsonl"))
    with SessionStore.open(mirror, "p", follower=False) as m:
        assert m.search(MARKER)["results"]  # the mirror's projections hold the words too
    assert traces(mirror)
    erase_at(home, secret, kept)
    cli(home, "export", str(tmp_path / "2.jsonl"))
    out = json.loads(cli(mirror, "import", str(tmp_path / "2.jsonl"), "--json"))
    assert out["mode"] == "verbatim" and out["already_present"] == 8
    assert traces(mirror) == []
    assert json.loads(cli(mirror, "log", "verify", "--json"))["erased"] == 6
    assert json.loads(cli(mirror, "log", "verify", "--json"))["head_hash"] == \
        json.loads(cli(home, "log", "verify", "--json"))["head_hash"]
    cli(mirror, "doctor")  # exit 0: nothing left pending
    with SessionStore.open(mirror, "p", follower=False) as m:
        assert m.get_session(secret) is None and m.search(MARKER)["results"] == []
        assert [x["content"] for x in m.get_messages(kept)] == ["plain", "after the erase"]


def test_log_copy_into_and_out_of_a_profile_takes_the_erased_words_out_of_the_copy(tmp_path: Path) -> None:
    home, secret, kept = source(tmp_path)
    bare = tmp_path / "copy"  # a log directory
    mirror = tmp_path / "mirror"  # a profile whose log is copied from the source's
    cli(home, "log", "copy", "--to", str(bare))
    cli(mirror, "log", "copy", "--from", str(home / "profiles" / "p" / "log"))
    with SessionStore.open(mirror, "p", follower=False) as m:
        assert m.search(MARKER)["results"]
    erase_at(home, secret, kept)
    assert json.loads(cli(home, "log", "copy", "--to", str(bare), "--json"))["verify"]["erased"] == 6
    assert traces(bare) == []
    assert json.loads(cli(mirror, "log", "copy", "--from", str(home / "profiles" / "p" / "log"),
                          "--json"))["verify"]["erased"] == 6
    assert traces(mirror) == []
    cli(mirror, "doctor")
    with SessionStore.open(mirror, "p", follower=False) as m:
        assert m.get_session(secret) is None and len(m.get_messages(kept)) == 2


def test_an_imported_erase_record_stubs_what_each_local_log_held(tmp_path: Path) -> None:
    home, secret, kept = source(tmp_path)
    on_disk, in_memory = EventLog.open(tmp_path / "t"), MemoryLog()
    try:
        src = EventLog.open(home / "profiles" / "p" / "log")
        for target in (on_disk, in_memory):
            copy_log(src, target)
        src.close()
        erase_at(home, secret, kept)
        src = EventLog.open(home / "profiles" / "p" / "log")
        try:
            for target in (on_disk, in_memory):
                copy_log(src, target)
                assert list(target.read()) == list(src.read())  # the stubs too, not only the record
                assert target.verify().erased == 6 and target.erase_mark() == src.erase_mark()
        finally:
            src.close()
        assert on_disk.erase_pending() == on_disk.erase_mark()  # its files: until a compaction
        on_disk.compact()
        assert traces(tmp_path / "t") == []
    finally:
        on_disk.close()
        in_memory.close()


def test_log_copy_resumes_into_a_log_directory_that_was_compacted(tmp_path: Path) -> None:
    """`log copy --to DIR` looked for DIR/data.mdb to tell a log from a folder holding other
    files; a compacted log keeps its data in DIR/g<N>/ (DIR/data.mdb is a link to nowhere), so
    the next copy into a mirror that an erase had compacted was refused ('holds other files and
    no log'; outside audit, helper-74)."""
    home, secret, kept = source(tmp_path)
    bare = tmp_path / "copy"
    cli(home, "log", "copy", "--to", str(bare))
    erase_at(home, secret, kept)
    cli(home, "log", "copy", "--to", str(bare))  # compacts the copy: its log moves into g<N>/
    with SessionStore.open(home, "p", follower=False) as store:
        store.append_message(kept, "user", "later")
    out = json.loads(cli(home, "log", "copy", "--to", str(bare), "--json"))
    assert out["copied"] == 1 and out["skipped"] == 10 and out["verify"]["ok"]


@pytest.mark.parametrize("current", ["file", "link"])
def test_log_copy_to_a_folder_whose_current_is_not_a_log_generation_is_refused_as_other_files(
        tmp_path: Path, current: str) -> None:
    """The check that a compacted log is a log read <dir>/current as the log's generation link:
    a folder holding a plain file named current, or a deployment's current link to a release,
    was refused with 'is not a symlink to a log generation' and the hint to restore the
    profile's log from a backup, for a folder that never held a log."""
    home, _, _ = source(tmp_path)
    folder = tmp_path / "deploy"
    (folder / "releases" / "7").mkdir(parents=True)
    if current == "file":
        (folder / "current").write_text("7\n")
    else:
        (folder / "current").symlink_to("releases/7")
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "log", "copy", "--to", str(folder)])
    assert r.exit_code != 0
    assert "holds other files (current, releases) and no log" in r.output, r.output
    assert "backup" not in r.output
    assert sorted(p.name for p in folder.iterdir()) == ["current", "releases"]


@pytest.mark.postgres
def test_a_postgres_mirror_takes_the_erased_words_out_too(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    """The same for a log on PostgreSQL (left by helper-74): the imported record is stored as an
    erase stores it and, as the head the import's transaction just wrote, lets the profile's
    erase_events function stub what it names. Its rows then hold stubs (kind 3), the projections
    of a profile on it are rebuilt without the words, and verify counts them erased."""
    from eventlog.log.postgres import PostgresLog

    home, secret, kept = source(tmp_path)
    src_dir = home / "profiles" / "p" / "log"
    mirror = tmp_path / "mirror"  # this host's projections of a profile whose log is on the server

    def mirror_cli(*args: str) -> str:
        r = CliRunner().invoke(main, ["--home", str(mirror), "--profile", pg_profile, "--log-url", pg_url, *args])
        assert r.exit_code == 0, r.output
        return r.stdout

    mirror_cli("log", "copy", "--from", str(src_dir))
    assert json.loads(mirror_cli("search", MARKER, "--json"))["results"]
    with PostgresLog.open(pg_url, profile=pg_profile + "-bare") as bare, EventLog.open(src_dir) as src:
        copy_log(src, bare)
    erase_at(home, secret, kept)
    out = json.loads(mirror_cli("log", "copy", "--from", str(src_dir), "--json"))
    assert out["verify"]["erased"] == 6
    assert json.loads(mirror_cli("search", MARKER, "--json"))["results"] == []
    assert traces(mirror) == []
    with PostgresLog.open(pg_url, profile=pg_profile + "-bare") as bare, EventLog.open(src_dir) as src:
        copy_log(src, bare)
        assert bare.stubbed == 6
        assert list(bare.read()) == list(src.read()) and bare.verify().erased == 6
        with psycopg.connect(pg_url, autocommit=True) as su:
            kinds = dict(su.execute(f'SELECT seq, get_byte(body, 0) FROM "{bare.info.schema}".events').fetchall())
        erased_seqs = [e["seq"] for e in src.read() if "data" not in e]
        assert len(erased_seqs) == 6 and all(kinds[q] == 3 for q in erased_seqs)
        assert sorted(q for q, k in kinds.items() if k == 3) == erased_seqs


@pytest.mark.postgres
def test_an_imported_erase_record_the_server_refuses_to_act_on_leaves_the_import_whole(
        pg_url: str, pg_profile: str, caplog: pytest.LogCaptureFixture) -> None:
    """A hand-made log.erased record on a session (no erase writes one: erase_events refuses it)
    naming an event the target holds: the import still goes in, whole, the event stays as it was,
    and a warning says to erase on the target too (the stubbing runs in a savepoint)."""
    import time

    from eventlog.log import codec
    from eventlog.log.base import erase_event
    from eventlog.log.postgres import PostgresLog

    src = MemoryLog()
    src.append([{"type": "x.y", "session": "s", "data": {"text": MARKER}}])
    with PostgresLog.open(pg_url, profile=pg_profile) as target:
        copy_log(src, target)
        first = next(iter(src.read()))
        p = codec.prepare({**erase_event([[1, first["hash"]]], {"reason": "r"}), "session": "s"}, log_type=True)
        raw, _ = codec.seal(p, 2, time.time_ns(), first["hash"])
        with caplog.at_level("WARNING", logger="eventlog.log.postgres"):
            assert target.append_sealed([raw]) == 1
        assert target.stubbed == 0 and target.head()[0] == 2
        assert next(iter(target.read()))["data"] == {"text": MARKER}
        assert "could not stub" in caplog.text


def test_a_mirror_an_earlier_release_fed_is_found_by_verify_and_doctor_and_erased_again(tmp_path: Path) -> None:
    """A mirror fed by a release before 2026-12-07 holds the source's ``log.erased`` record and,
    whole, the events it names (that release imported records without stubbing): the chain
    verifies, so nothing found the words. Reproduced on real bytes — the events' stored values
    from before the erase written back over their stubs — ``log verify`` still says ok (the
    chain holds) but counts them and names the session, with the remedy; ``doctor`` reports the
    profile unfinished (exit 1); erasing the session again takes the words out of every file."""
    import lmdb

    from eventlog.log.lmdb import generation_dir

    home, secret, kept = source(tmp_path)
    log_dir = home / "profiles" / "p" / "log"

    def values() -> dict[bytes, bytes]:
        env = lmdb.open(str(generation_dir(log_dir)), max_dbs=8, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                return {bytes(k): bytes(v) for k, v in txn.cursor(db=env.open_db(b"events", txn=txn))}
        finally:
            env.close()

    before = values()
    erase_at(home, secret, kept)
    stubs = {k for k, v in values().items() if k in before and v != before[k]}
    assert len(stubs) == 6  # the creation and five messages
    env = lmdb.open(str(generation_dir(log_dir)), max_dbs=8)
    with env.begin(write=True) as txn:
        db = env.open_db(b"events", txn=txn)
        for k in stubs:
            txn.put(k, before[k], db=db)
    env.close()
    assert traces(log_dir)  # the words are back in the log file

    shown = json.loads(cli(home, "log", "verify", "--json"))
    assert shown["ok"] is True and shown["unerased"] == 6 and shown["unerased_sessions"] == [secret], shown
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "log", "verify"])
    assert r.exit_code == 0 and "6 event(s) that erase records name still hold their content" in r.stderr
    assert f"eventlog sessions erase ID --reason ...` for {secret}" in r.stderr, r.stderr
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "doctor", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["log"]["unerased_sessions"] == [secret], r.output

    cli(home, "sessions", "erase", secret, "--reason", "again")
    shown = json.loads(cli(home, "log", "verify", "--json"))
    assert shown["ok"] is True and shown["unerased"] == 0 and shown["erased"] == 6, shown
    assert not traces(home)
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", "p", "doctor", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["log"]["unerased"] == 0, r.output
