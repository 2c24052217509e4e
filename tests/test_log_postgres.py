"""The log contract (eventlog.log.contract) against PostgresLog on a real server, plus what only
a shared server has: byte-identical chains with the LMDB log, privileges, the registry."""
from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventlog.errors import ConcurrencyError, StorageError, ValidationError
from eventlog.log import Log
from eventlog.log.contract import Edit, EraseContract, GroupCommitContract, LogContract, ev, stored
from eventlog.log.lmdb import EventLog
from eventlog.log.pg_schema import grant_login
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres
_NAMES = itertools.count(1)


def superuser(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def schema_of(url: str, profile: str) -> str:
    with superuser(url) as c:
        row = c.execute("SELECT schema_name FROM eventlog.profiles WHERE name = %s", (profile,)).fetchone()
        assert row is not None
        return str(row[0])


class TestPostgresLog(LogContract, GroupCommitContract, EraseContract):
    @pytest.fixture(autouse=True)
    def _server(self, pg_url: str, pg_profile: str) -> None:
        self.url = pg_url
        self.base = pg_profile

    def make_log(self, tmp_path: Path) -> Log:
        return PostgresLog.open(self.url, profile=f"{self.base}-{next(_NAMES)}")

    def reopen(self, log: Log) -> Log:
        assert isinstance(log, PostgresLog)
        log.close()
        return PostgresLog.open(self.url, profile=log.profile)

    def tamper(self, log: Log, edit: Edit) -> Log:
        """Edits the canonical bytes through a superuser connection (no role of eventlog may); a
        changed event is written back as a format-1 value (the canonical JSON itself, which
        every reader accepts), a removed one deleted. Damage to format-2 bytes: see below."""
        assert isinstance(log, PostgresLog)
        before = dict(log.read(raw=True))
        log.close()
        after = dict(before)
        edit(after)
        schema = schema_of(self.url, log.profile)
        with superuser(self.url) as c:
            for seq in before.keys() - after.keys():
                c.execute(f'DELETE FROM "{schema}".events WHERE seq = %s', (seq,))
            # Two rows may trade bodies (a swap): move ids aside first so the unique index holds.
            changed = {s: raw for s, raw in after.items() if before.get(s) != raw}
            for seq in changed:
                c.execute(f"UPDATE \"{schema}\".events SET id = 'tmp-' || seq WHERE seq = %s", (seq,))
            for seq, raw in changed.items():
                c.execute(f'UPDATE "{schema}".events SET body = %s, id = %s WHERE seq = %s',
                          (raw, f"tampered-{seq}", seq))
        return PostgresLog.open(self.url, profile=log.profile)


# ---- beyond the contract ---------------------------------------------------------------------


@pytest.fixture
def pglog(pg_url: str, pg_profile: str) -> Any:
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        yield lg


def test_chain_and_bytes_are_identical_to_the_lmdb_log(pglog: PostgresLog, tmp_path: Path) -> None:
    pglog.append([dict(ev("a", text="héllo ☃", n=i), id=f"x-{i}") for i in range(20)])
    pglog.append([ev(None, k=[1, 2.5, None, {"z": "y"}])])
    with EventLog.open(tmp_path / "lmdb", profile="p") as lm:
        assert lm.append_sealed(stored(pglog)) == 21  # an LMDB log accepts the PostgreSQL chain verbatim
        assert lm.verify().ok and lm.head() == pglog.head() and stored(lm) == stored(pglog)
        lm.append([ev("b", n=1), ev("b", n=2)])
        assert pglog.append_sealed(stored(lm)[21:]) == 2  # and the other way round
    assert pglog.verify().ok and pglog.head()[0] == 23


def test_events_are_stored_in_format_2_and_damage_to_those_bytes_is_found(pg_url: str, pglog: PostgresLog) -> None:
    pglog.append([ev(i=i, text="alpha beta gamma " * 20) for i in range(3000)])  # past DICT_TRAIN_AFTER
    deadline = time.monotonic() + 20
    while not pglog._compression.current and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pglog._compression.current == 1, "a dictionary is trained once the log holds 2,000 events"
    pglog.append([ev(i=i, text="alpha beta gamma " * 20) for i in range(3000, 3010)])
    schema = pglog.info.schema
    with superuser(pg_url) as c:
        kinds = dict(c.execute(f'SELECT seq, get_byte(body, 0) FROM "{schema}".events WHERE seq IN (5, 3010)').fetchall())
        assert kinds == {5: 2, 3010: 2}  # format 2's kind byte, not '{'
        codecs = c.execute(f'SELECT body FROM "{schema}".events WHERE seq = 3010').fetchone()
        assert codecs is not None and len(codecs[0]) < len(stored(pglog)[3009]) / 2
    with PostgresLog.open(pg_url, profile=pglog.profile) as other:  # another handle decodes with the stored dictionary
        assert other.get(3010) == pglog.get(3010) and other.verify().ok
    with superuser(pg_url) as c:  # one byte of compressed data flipped
        c.execute(f'UPDATE "{schema}".events SET body = overlay(body placing '
                  f"set_byte(substring(body from length(body) - 3 for 1), 0, "
                  f"get_byte(substring(body from length(body) - 3 for 1), 0) # 85) "
                  f'from length(body) - 3 for 1) WHERE seq = 3005')
    res = pglog.verify()
    assert not res.ok and res.first_bad_seq == 3005, res


def test_events_are_immutable_for_the_profile_role(pg_url: str, pglog: PostgresLog) -> None:
    pglog.append([ev(n=1)])
    role, schema = pglog.info.role, pglog.info.schema
    with superuser(pg_url) as c:
        c.execute(f'SET ROLE "{role}"')
        for stmt in (f'UPDATE "{schema}".events SET body = body', f'DELETE FROM "{schema}".events',
                     f'TRUNCATE "{schema}".events', f'DROP TABLE "{schema}".events'):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(stmt)
        assert c.execute(f'SELECT count(*) FROM "{schema}".events').fetchone() == (1,)
    assert pglog.verify().ok


def test_a_profile_role_cannot_read_another_profiles_schema(pg_url: str, pg_server: Any, pg_profile: str) -> None:
    a, b = f"{pg_profile}-a", f"{pg_profile}-b"
    with PostgresLog.open(pg_url, profile=a) as la, PostgresLog.open(pg_url, profile=b) as lb:
        la.append([ev(secret="of a")])
        lb.append([ev(secret="of b")])
        sa, sb = la.info.schema, lb.info.schema
    login = f"host_{pg_profile.replace('-', '_')}"
    with superuser(pg_url) as c:
        c.execute(f"CREATE ROLE \"{login}\" LOGIN PASSWORD 'pw-a'")
        grant_login(c, a, login)
    url_a = pg_server.url(user=login, password="pw-a")
    with PostgresLog.open(url_a, profile=a) as mine:  # the login reaches its own profile
        assert [e["data"]["secret"] for e in mine.read()] == ["of a"]
        mine.append([ev(secret="more of a")])
    with pytest.raises(StorageError) as info:
        PostgresLog.open(url_a, profile=b)  # the registry does not even name b's schema to it
    assert "may not use it" in str(info.value)
    with psycopg.connect(url_a, autocommit=True) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(f'SELECT body FROM "{sb}".events')
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM eventlog.profiles")
        assert c.execute("SELECT count(*) FROM eventlog.profile(%s)", (b,)).fetchone() == (0,)
        assert c.execute(f'SELECT count(*) FROM "{sa}".events').fetchone() == (2,)  # its own, by inheritance
        c.execute(f'SET ROLE "{la.info.role}"')
        assert c.execute(f'SELECT count(*) FROM "{sa}".events').fetchone() == (2,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(f'SELECT body FROM "{sb}".events')


def test_profile_names_up_to_64_characters_get_their_own_schema(pg_url: str, pg_profile: str) -> None:
    long_a = (pg_profile + "-" + "a" * 64)[:64]
    long_b = long_a[:-1] + "b"  # equal in the first 63 bytes: would collide as identifiers
    with PostgresLog.open(pg_url, profile=long_a) as la, PostgresLog.open(pg_url, profile=long_b) as lb:
        la.append([ev(n=1)])
        assert lb.head()[0] == 0 and la.info.schema != lb.info.schema
    with pytest.raises(ValidationError):
        PostgresLog.open(pg_url, profile="../bad")


def test_an_unreachable_server_is_a_storage_error_with_a_hint(pg_server: Any) -> None:
    url = f"postgresql://postgres:x@127.0.0.1:{pg_server.port + 1 if pg_server.port < 65535 else 1}/eventlog"
    with pytest.raises(StorageError) as info:
        PostgresLog.open(url, profile="p", connect_timeout=2)
    assert "cannot reach PostgreSQL" in str(info.value) and "x@" not in str(info.value)


def test_two_handles_share_one_order_and_expected_version(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as a, PostgresLog.open(pg_url, profile=pg_profile) as b:
        seqs: list[int] = []
        lock = threading.Lock()

        def work(lg: PostgresLog, w: int) -> None:
            for i in range(30):
                got = lg.append([ev(f"w{w}", i=i)])
                with lock:
                    seqs.extend(got)

        ts = [threading.Thread(target=work, args=(lg, w)) for w, lg in enumerate([a, b, a, b])]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(seqs) == list(range(1, 121))
        assert a.append([ev("w0", i=30)], expected_version=30) == [121]
        with pytest.raises(ConcurrencyError):
            b.append([ev("w0", i=31)], expected_version=30)
        assert a.verify().ok and b.head() == a.head()


def test_nosync_durability_and_bad_options(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile, durability="nosync") as lg:
        assert lg.append([ev(n=1)]) == [1] and lg.durability == "nosync"
    with pytest.raises(ValidationError):
        PostgresLog.open(pg_url, profile=pg_profile, durability="fsync")


def test_the_role_changes_events_only_through_an_audited_erase(pg_url: str, pg_profile: str) -> None:
    """The profile's role has no UPDATE on events; its one way to change one is erase_events,
    which refuses stubs without the log.erased record of the same transaction, and any stub
    that does not keep the event's hash."""
    from eventlog.log import codec
    from eventlog.log import stored as stored_format
    from eventlog.log.pg_schema import lookup

    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        lg.append([ev("a", secret="SECRET-ROW"), ev("a", n=2)])
        env = next(lg.read())
    with superuser(pg_url) as c:
        info = lookup(c, pg_profile)
        assert info is not None
        c.execute(f'SET ROLE "{info.role}"')
        stub = stored_format.pack_stub(codec.stub(env))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(f'UPDATE "{info.schema}".events SET body = %s WHERE seq = 1', (stub,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # no erase record in this transaction
            c.execute(f'SELECT "{info.schema}".erase_events(%s::bigint[], %s::bytea[])', ([1], [stub]))
        c.execute("RESET ROLE")
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        assert lg.verify().ok and lg.verify().erased == 0
        assert lg.erase([1], {"reason": "asked", "by": "test"}) == 3
        res = lg.verify()
        assert res.ok and res.erased == 1
        assert not any(b"SECRET-ROW" in raw for _, raw in lg.read(raw=True))


def test_erase_events_refuses_a_stub_the_record_does_not_name(pg_url: str, pg_profile: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """erase_events checked that the transaction had appended some log.erased record, not that
    the record named the events it was given: the profile's role could stub any event beside a
    record naming another (found by an outside audit). The record is now stored uncompressed and
    the function checks each [seq, hash] against it; nothing changes when one is not named."""
    from eventlog.errors import StorageError
    from eventlog.log import postgres as pg_module

    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        lg.append([ev("a", secret="SECRET-ONE"), ev("a", secret="SECRET-TWO")])
        real = pg_module.erase_event
        monkeypatch.setattr(pg_module, "erase_event", lambda listed, data: real(listed[:1], data))
        with pytest.raises(StorageError, match="does not name event 2"):
            lg.erase([1, 2], {"reason": "one named, two stubbed"})
        res = lg.verify()
        assert res.ok and res.erased == 0 and lg.head()[0] == 2
        monkeypatch.setattr(pg_module, "erase_event", real)
        assert lg.erase([1, 2], {"reason": "both named"}) == 3
        res = lg.verify()
        assert res.ok and res.erased == 2


def test_an_administrator_open_upgrades_an_earlier_erase_function(pg_url: str, pg_profile: str) -> None:
    from eventlog.log.pg_schema import ERASE_VERSION, lookup

    PostgresLog.open(pg_url, profile=pg_profile).close()
    with superuser(pg_url) as c:
        info = lookup(c, pg_profile)
        assert info is not None
        fn = f'"{info.schema}".erase_events(bigint[], bytea[])'
        c.execute(f"COMMENT ON FUNCTION {fn} IS NULL")  # as the previous release left it
    PostgresLog.open(pg_url, profile=pg_profile).close()
    with superuser(pg_url) as c:
        row = c.execute("SELECT obj_description(to_regprocedure(%s), 'pg_proc')", (fn,)).fetchone()
        assert row is not None and row[0] == ERASE_VERSION


def test_a_second_administrator_is_told_why_it_cannot_create_a_profile(pg_url: str, pg_profile: str) -> None:
    """The registry belongs to the administrator that created it: another with the same rights
    was told the profile 'does not exist, or this login may not use it', hiding the permission
    error; and grant_login by it raised psycopg's own error (found by an outside audit)."""
    from eventlog.errors import StorageError
    from eventlog.log.pg_schema import grant_login

    PostgresLog.open(pg_url, profile=pg_profile).close()  # the registry exists, owned by the first
    name = f"admin_{pg_profile.replace('-', '_')}"
    with superuser(pg_url) as c:
        c.execute(f"CREATE ROLE \"{name}\" LOGIN CREATEROLE PASSWORD 'pw'")
        db = c.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        c.execute(f'GRANT CREATE ON DATABASE "{db}" TO "{name}"')
    other = pg_url.replace(pg_url.split("://", 1)[1].split("@", 1)[0], f"{name}:pw")
    with pytest.raises(StorageError, match="may not create it: permission denied") as info:
        PostgresLog.open(other, profile=pg_profile + "-b")
    assert "GRANT" in (info.value.hint or "")
    with psycopg.connect(other, autocommit=True) as c2:
        with pytest.raises(StorageError, match="granting profile"):
            grant_login(c2, pg_profile, name)
    with superuser(pg_url) as c:
        c.execute(f'GRANT "{pg_url.split("://", 1)[1].split(":", 1)[0]}" TO "{name}"')
    PostgresLog.open(other, profile=pg_profile + "-b").close()  # as a member of the owner's role it may


def _backends(url: str, db: str) -> int:
    """Connections open on database ``db`` other than the one asking."""
    with superuser(url) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                        (db,)).fetchone()
        assert row is not None
        return int(row[0])


def _until_no_backends(url: str, db: str) -> int:
    """The count of :func:`_backends` once it reaches 0, or after 10 s (a closed connection's
    backend ends a moment after the close)."""
    deadline = time.monotonic() + 10
    while (n := _backends(url, db)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


def test_a_log_closed_while_its_dictionary_trains_leaves_no_connection_open(
        pg_server: Any, pg_profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two handles on one profile: one imports an export verbatim (append_sealed), past the
    count at which a log trains its compression dictionary; the other's next append starts the
    training on a thread of its own, and the handle is closed meanwhile, then the first verifies
    and closes. The training's reader connection, taken or given back after the close, went
    back into the closed handle's pool and stayed open (a ResourceWarning, 'connection deleted
    while still open', and a server backend, until garbage collection). A closed pool hands out
    no connection and closes each given back."""
    from eventlog.log import postgres as pg_module

    monkeypatch.setattr(pg_module, "DICT_TRAIN_AFTER", 100)
    db = f"leak_{pg_profile}".replace("-", "_")
    pg_server.create_database(db)
    url = pg_server.url(db)
    admin = pg_server.url()
    with EventLog.open(tmp_path / "src", profile="p") as src:
        src.append([ev("s", text="alpha beta gamma " * 8, i=i) for i in range(150)])
        raws = stored(src)
    for trial in range(8):
        a = PostgresLog.open(url, profile=f"p{trial}")
        b = PostgresLog.open(url, profile=f"p{trial}")
        assert a.append_sealed(raws) == 150
        b.append([ev("s", text="one more")])  # past DICT_TRAIN_AFTER: b trains its dictionary on a thread
        b.close()
        assert a.verify().ok
        a.close()
        for t in threading.enumerate():
            if t.name == "eventlog-pg-train-dict":
                t.join(30)
        assert _until_no_backends(admin, db) == 0, f"trial {trial}: a connection of a closed log is still open"
