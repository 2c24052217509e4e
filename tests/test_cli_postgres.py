"""The CLI on a PostgreSQL log: --log-url / EVENTLOG_LOG_URL select it for every command, and
`eventlog log copy --to/--from` moves a log between backends keeping seqs and hashes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from eventlog.cli import main
from eventlog.log import EventLog
from eventlog.log.contract import stored
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres


def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, env=env, catch_exceptions=False)


def test_log_url_selects_postgres_for_every_command(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    base = ["--home", str(tmp_path / "h1"), "--profile", pg_profile, "--log-url", pg_url]
    res = run(*base, "log", "verify")
    assert res.exit_code == 1 and "may not use it" in res.output  # not created by a read
    res = run(*base, "doctor")  # nor by doctor, here either (it left an empty profile folder: outside audit)
    assert res.exit_code == 1 and "may not use it" in res.output
    assert not (tmp_path / "h1" / "profiles" / pg_profile).exists()
    for _ in range(2):  # init creates the profile on the server, then finds it there
        res = run(*base, "init")
        assert res.exit_code == 0 and res.output.strip().endswith(f"profile {pg_profile}"), res.output
        assert "password" not in res.output
    events = "\n".join(json.dumps({"type": "session.created", "session": f"s{i}", "data": {"source": "cli"}})
                       for i in range(3))
    res = run(*base, "append", "--json", input=events)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"seqs": [1, 2, 3]}
    res = run(*base, "messages", "add", "s1", "--role", "user", "--content", "hello from host one", "--json")
    assert res.exit_code == 0, res.output
    other_host = ["--home", str(tmp_path / "h2"), "--profile", pg_profile]
    res = run(*other_host, "sessions", "show", "s1", "--json", env={"EVENTLOG_LOG_URL": pg_url})
    assert res.exit_code == 0, res.output
    assert [m["content"] for m in json.loads(res.output)["messages"]] == ["hello from host one"]
    res = run(*other_host, "log", "verify", "--json", env={"EVENTLOG_LOG_URL": pg_url})
    assert res.exit_code == 0 and json.loads(res.output)["head_seq"] == 4
    res = run(*other_host, "doctor", "--json", env={"EVENTLOG_LOG_URL": pg_url})
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "h2" / "profiles" / pg_profile / "log").exists()  # no local log was made


def test_log_copy_to_and_from_postgres(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    home = ["--home", str(tmp_path / "h"), "--profile", pg_profile]
    events = "\n".join(json.dumps({"type": "session.created", "session": f"s{i}", "data": {"source": "cli"}})
                       for i in range(25))
    assert run(*home, "append", input=events).exit_code == 0
    res = run(*home, "log", "copy", "--to", pg_url, "--json")
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.output)
    assert (out["copied"], out["skipped"], out["head_seq"], out["verify"]["ok"]) == (25, 0, 25, True)
    with EventLog.open(tmp_path / "h" / "profiles" / pg_profile / "log") as lm, \
            PostgresLog.open(pg_url, profile=pg_profile) as pg:
        assert stored(pg) == stored(lm) and pg.head() == lm.head()
    res = run(*home, "log", "copy", "--to", pg_url)  # again: everything is there already
    assert res.exit_code == 0 and res.output.startswith("copied 0 events (25 already there)")

    back = ["--home", str(tmp_path / "back"), "--profile", pg_profile]
    res = run(*back, "log", "copy", "--from", pg_url, "--json")
    assert res.exit_code == 0 and json.loads(res.output)["head_seq"] == 25
    res = run(*back, "sessions", "list", "--json")
    assert res.exit_code == 0 and len(json.loads(res.output)) == 25

    res = run(*home, "log", "copy")
    assert res.exit_code == 2 and "exactly one of --to and --from" in res.output
    other = ["--home", str(tmp_path / "other"), "--profile", pg_profile]
    theirs = "\n".join(json.dumps({"type": "session.created", "session": f"t{i}", "data": {"source": "cli"}})
                       for i in range(30))
    assert run(*other, "append", input=theirs).exit_code == 0
    res = run(*other, "log", "copy", "--to", pg_url)  # another log's events: refused, nothing written
    assert res.exit_code == 1 and "holds another log" in res.output
    with PostgresLog.open(pg_url, profile=pg_profile) as pg:
        assert pg.head()[0] == 25


def test_a_refused_import_leaves_no_profile_on_the_server(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    """Locally a refused import into a new profile removes the directory it made; on PostgreSQL
    the profile (schema, role, registry row) it provisioned used to stay, empty."""
    from eventlog.log.pg_schema import connect, drop_if_empty, lookup

    base = ["--home", str(tmp_path / "h"), "--profile", pg_profile, "--log-url", pg_url]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "e1", "type": "session.created", "session": "s1", "data": {"source": "cli"}}\n'
                   '{"id": "e2", "type": "message.appended", "session": "nowhere", '
                   '"data": {"role": "user", "content": "x"}}\n')
    # Roles of no registered profile, before and after: the server is shared by the other tests
    # of this session (and other files' tests run first under xdist), whose roles are not this one's.
    def orphans() -> list[str]:
        with connect(pg_url) as conn:
            registered = ("NOT IN (SELECT role_name FROM eventlog.profiles)"
                          if conn.execute("SELECT to_regclass('eventlog.profiles')").fetchone() != (None,) else "IS NOT NULL")
            return [r[0] for r in conn.execute(
                f"SELECT rolname FROM pg_roles WHERE rolname LIKE 'eventlog\\_%%\\_p%%' AND rolname {registered} ORDER BY 1")]

    before = orphans()
    res = run(*base, "import", str(bad))
    assert res.exit_code == 1 and "nowhere" in res.output, res.output
    with connect(pg_url) as conn:
        assert lookup(conn, pg_profile) is None
    assert orphans() == before
    assert not (tmp_path / "h" / "profiles" / pg_profile).exists()
    res = run(*base, "log", "verify")
    assert res.exit_code == 1 and "may not use it" in res.output

    good = tmp_path / "good.jsonl"
    good.write_text(bad.read_text().splitlines()[0] + "\n")
    assert run(*base, "import", str(good)).exit_code == 0
    res = run(*base, "import", str(bad))  # refused again: the profile that holds an event stays
    assert res.exit_code == 1
    with PostgresLog.open(pg_url, profile=pg_profile) as pg:
        assert pg.head()[0] == 1
    with connect(pg_url) as conn:
        assert drop_if_empty(conn, pg_profile) is False and lookup(conn, pg_profile) is not None


@pytest.mark.parametrize("userinfo, query, secret", [
    ("gateway:50%off", "", "50%off"),
    ("gateway:Tr0ub%dor", "", "Tr0ub%dor"),
    ("gateway:end%", "", "end%"),
    ("gateway", "?password=s3cr%et", "s3cr%et"),
    ("gateway", "?sslmode=prefer&password=x%zz1", "x%zz1"),
])
def test_a_password_with_a_bare_percent_is_refused_unechoed(tmp_path: Path, pg_server: Any, userinfo: str,
                                                           query: str, secret: str) -> None:
    """libpq refuses such a URL quoting the token whole ('invalid percent-encoded token:
    "50%off"'), and neither the URL check nor the redaction knew it: the password was printed
    (outside audit). Refused before connecting, naming the URL part; libpq's token is masked."""
    from eventlog import SessionStore
    from eventlog.errors import ValidationError
    from eventlog.log.pg_schema import redact

    url = f"postgresql://{userinfo}@127.0.0.1:{pg_server.port}/eventlog{query}"
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "--profile", "p", "--log-url", url, "log", "verify"])
    assert r.exit_code == 1 and r.stderr.startswith("error: invalid log: the URL's ") and "password" in r.stderr, r.stderr
    assert secret not in r.stdout + r.stderr and "%25" in r.stderr
    with pytest.raises(ValidationError) as info:
        SessionStore.open(home=tmp_path, profile="p", log=url)
    assert secret not in str(info.value) + repr(info.value)
    assert secret not in redact(f'invalid percent-encoded token: "{secret}"')
