"""Profiles stay apart on a shared server even when the profile's role is misused or a profile is
removed under an open handle (invariant 9). Each test here failed before its fix (outside audit)."""
from __future__ import annotations

from typing import Any

import psycopg
import pytest

from eventlog.errors import ProfileGoneError
from eventlog.log.contract import ev
from eventlog.log.postgres import PostgresLog, drop_empty_profile

pytestmark = pytest.mark.postgres


def superuser(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def terminate(url: str, *pids: int) -> None:
    with superuser(url) as c:
        for pid in pids:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_removed_profiles_id_is_never_given_again_and_its_open_handle_reaches_no_other_log(
        pg_url: str, pg_profile: str) -> None:
    """Ids were max(id) + 1: after a refused import removed the newest profile X, the next one
    created got X's id, so X's schema and role names, and a handle still open on X read Y's
    sessions and, once reconnected, appended into Y's log."""
    x, y = f"{pg_profile}-x", f"{pg_profile}-y"
    stale = PostgresLog.open(pg_url, profile=x)
    try:
        writer_pid = stale._writer.info.backend_pid if stale._writer else 0
        assert drop_empty_profile(pg_url, x)
        with PostgresLog.open(pg_url, profile=y) as ly:
            assert ly.info.id > stale.info.id and ly.info.schema != stale.info.schema
            assert ly.info.role != stale.info.role
            ly.append([ev("s", secret="of y")])
            with pytest.raises(ProfileGoneError, match="was removed"):
                stale.head()
            with pytest.raises(ProfileGoneError):
                stale.append([ev("s", written="by x")])  # on the connection opened before the removal
            terminate(pg_url, writer_pid)
            with pytest.raises(ProfileGoneError):
                stale.append([ev("s", written="by x")])  # on a new connection
            assert [e["data"] for e in ly.read()] == [{"secret": "of y"}] and ly.verify().ok
    finally:
        stale.close()


def test_a_handle_on_a_profile_removed_and_created_anew_refuses_every_new_connection(
        pg_url: str, pg_profile: str) -> None:
    stale = PostgresLog.open(pg_url, profile=pg_profile)
    try:
        assert drop_empty_profile(pg_url, pg_profile)
        with PostgresLog.open(pg_url, profile=pg_profile) as fresh:  # same name, another profile
            fresh.append([ev("s", n=1)])
            with pytest.raises(ProfileGoneError, match="removed and created anew"):
                stale.read_session("s").__next__()
            with pytest.raises(ProfileGoneError):
                stale.append([ev("s", n=2)])
            assert fresh.head()[0] == 1
    finally:
        stale.close()


def _host_login(pg_server: Any, pg_url: str, profile: str) -> str:
    """A login that holds the profile's role and nothing else (a host's)."""
    from eventlog.log.pg_schema import grant_login

    PostgresLog.open(pg_url, profile=profile).close()
    login = f"host_{profile.replace('-', '_')}"
    with superuser(pg_url) as c:
        c.execute(f"CREATE ROLE \"{login}\" LOGIN PASSWORD 'pw-h'")
        grant_login(c, profile, login)
    return str(pg_server.url(user=login, password="pw-h"))


def test_the_erase_function_refuses_an_erase_record_and_any_stub_but_the_events_own(
        pg_server: Any, pg_url: str, pg_profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """erase_events took the client's stub, checking only its hash and prev: a login holding only
    the profile's role (its own client code changed) erased an earlier log.erased record and
    stored a 'stub' whose session, type, id and ts were changed, and verify still said ok."""
    from eventlog.errors import StorageError
    from eventlog.log import codec
    from eventlog.log import postgres as pg_module

    with PostgresLog.open(_host_login(pg_server, pg_url, pg_profile), profile=pg_profile) as lg:
        seqs = lg.append([ev("victim", text=f"m{i}") for i in range(4)])
        record = lg.erase([seqs[1]], {"reason": "asked", "by": "dpo"})
        first = lg.get(record)
        assert first is not None
        before = dict(lg.read(raw=True))
        real_stub, real_erase_event = codec.stub, pg_module.erase_event
        # the client's own refusal to erase an erase record, removed; its record names what that one named
        monkeypatch.setattr(pg_module, "erasable", lambda wanted, at: [at(q) for q in wanted])
        monkeypatch.setattr(pg_module, "erase_event",
                            lambda listed, data: real_erase_event(listed + first["data"]["erased"], data))
        with pytest.raises(StorageError, match="never erased"):
            lg.erase([record], {"reason": "routine"})
        monkeypatch.setattr(pg_module, "erase_event", real_erase_event)

        def forged(env: dict[str, Any]) -> dict[str, Any]:
            out = real_stub(env)
            out.update(session="someone-else", type="session.deleted", id="forged-id", ts=1)
            return out

        monkeypatch.setattr(codec, "stub", forged)
        with pytest.raises(StorageError, match="cannot take this stub"):
            lg.erase([seqs[2]], {"reason": "routine"})
        monkeypatch.setattr(codec, "stub", real_stub)
        assert dict(lg.read(raw=True)) == before  # nothing changed
        assert lg.erase([seqs[2]], {"reason": "routine"}) == record + 1  # the genuine stub is taken
        res = lg.verify()
        assert res.ok and res.erased == 2
        gone, was = lg.get(seqs[2]), codec.decode(before[seqs[2]])
        assert gone is not None and gone.get("erased") is True
        assert {k: gone[k] for k in ("session", "type", "id", "ts")} == {k: was[k] for k in ("session", "type", "id", "ts")}


def test_an_erase_record_whose_data_holds_a_nul_character_is_written(pg_url: str, pg_profile: str) -> None:
    """erase_events read the record's data as jsonb, which cannot hold U+0000: such an erase
    failed on PostgreSQL only (an untyped 'unsupported Unicode escape sequence')."""
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        lg.append([ev("s", text="secret \u0000 with a NUL"), ev("s", text="\\u0000 as text")])
        assert lg.erase([1, 2], {"reason": "asked", "ticket": "T-1\u0000", "note": "\\u0000\\\\u0000"}) == 3
        res = lg.verify()
        assert res.ok and res.erased == 2
        rec = lg.get(3)
        assert rec is not None and rec["data"]["ticket"] == "T-1\u0000"


def test_a_row_planted_past_the_head_fails_appends_at_once_naming_it(pg_server: Any, pg_url: str,
                                                                     pg_profile: str) -> None:
    """The role may INSERT events: a row planted at head + 3 made every append that reached that
    seq retry its UniqueViolation for reconnect_timeout, as if the connection were lost, then
    fail as a plain StorageError. Now it fails at once, an IntegrityError naming the constraint."""
    import time

    from eventlog.errors import IntegrityError

    url = _host_login(pg_server, pg_url, pg_profile)
    with PostgresLog.open(url, profile=pg_profile, reconnect_timeout=10) as lg:
        lg.append([ev("s", i=i) for i in range(3)])
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'SET ROLE "{lg.info.role}"')
            c.execute(f'INSERT INTO "{lg.info.schema}".events (seq, id, session, body) VALUES (6, %s, NULL, %s)',
                      ("planted", b"\x02junk"))
        assert lg.append([ev("s", n=4)]) == [4] and lg.append([ev("s", n=5)]) == [5]
        t0 = time.monotonic()
        with pytest.raises(IntegrityError, match="events_pkey") as info:
            lg.append([ev("s", n=6)])
        assert time.monotonic() - t0 < 5, "not retried as if the connection were lost"
        assert "verify" in (info.value.hint or "")
        res = lg.verify()
        assert not res.ok and res.first_bad_seq == 6
