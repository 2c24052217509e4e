"""The CLI on a PostgreSQL log, driven as an operator meets it: the server refusing a read or
cutting a statement short is an error that names it (exit 1), never a damaged log, a foreign
projection or an empty answer."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from eventlog.cli import main
from eventlog.log.pg_schema import connect, lookup

pytestmark = pytest.mark.postgres


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_a_read_the_server_refuses_is_an_error_and_the_projection_is_kept(tmp_path: Path, pg_server: Any,
                                                                         pg_url: str, pg_profile: str) -> None:
    """With SELECT on the events revoked from the profile's role (the head still readable),
    `sessions list` took the failed read of seq 1 for a projection of another log: it rebuilt
    state.db and the index, empty, called the log damaged at seq 1 and answered [] with exit 0."""
    base = ["--home", str(tmp_path / "h"), "--profile", pg_profile, "--log-url", pg_url]
    for sid in ("s1", "s2"):
        assert run(*base, "sessions", "new", "--id", sid).exit_code == 0
    assert run(*base, "messages", "add", "s1", "--role", "user", "--content", "kept words").exit_code == 0
    pointer = tmp_path / "h" / "profiles" / pg_profile / "state.db"
    built = os.readlink(pointer)
    with connect(pg_url) as conn:
        info = lookup(conn, pg_profile)
    assert info is not None
    pg_server.psql(f'REVOKE SELECT ON "{info.schema}".events FROM "{info.role}"')
    try:
        for cmd in (["sessions", "list", "--json"], ["search", "kept", "--json"], ["stats", "--json"]):
            res = run(*base, *cmd)
            assert res.exit_code == 1, (cmd, res.output)
            assert "permission denied for table events" in res.stderr, (cmd, res.stderr)
            assert "damaged" not in res.stderr and "another log" not in res.stderr, (cmd, res.stderr)
            assert res.stdout == ""
        assert os.readlink(pointer) == built  # not rebuilt
    finally:
        pg_server.psql(f'GRANT SELECT ON "{info.schema}".events TO "{info.role}"')
    res = run(*base, "sessions", "list", "--json")
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    assert sorted(s["id"] for s in json.loads(res.stdout)) == ["s1", "s2"]
    assert os.readlink(pointer) == built
    res = run(*base, "search", "kept", "--json")
    assert res.exit_code == 0 and [r["session_id"] for r in json.loads(res.stdout)["results"]] == ["s1"]

