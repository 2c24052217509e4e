"""Writes tests/data/pg-release1-profile.sql: a profile created by the first PostgreSQL release
(commit 1794d19: format 1, no zdicts table, no erase function) and appended to by it, dumped with
pg_dump (plain INSERTs, no owner) and its registry row, the profile's names replaced by
placeholders ({schema}, {role}, {id}, {name}) that tests/test_log_postgres_upgrade.py fills in::

    git worktree add /tmp/rel 1794d19      # or: mkdir /tmp/rel && git archive 1794d19 | tar -x -C /tmp/rel
    PYTHONPATH=/tmp/rel python tests/data/make_pg_release1_profile.py postgresql://postgres:pw@host:port/db \\
        > tests/data/pg-release1-profile.sql

Needs pg_dump on PATH (of the server's major version or newer) and an administrator URL.
"""
import subprocess
import sys

import psycopg

from eventlog.log.postgres import PostgresLog  # the release's, from PYTHONPATH

url = sys.argv[1]
name = "release1-profile"
with PostgresLog.open(url, profile=name) as lg:
    assert lg.info.format == 1, "run this with the first PostgreSQL release on PYTHONPATH"
    lg.append([{"type": "note.added", "session": "s1", "data": {"text": f"old {i}"}, "id": f"old{i}"}
               for i in range(3)])
    lg.append([{"type": "note.added", "session": "s2", "data": {"text": "héllo ☃"}, "id": "old3"}])
    schema, role, pid = lg.info.schema, lg.info.role, lg.info.id
dump = subprocess.run(["pg_dump", "--dbname", url, "--schema", schema, "--inserts", "--no-owner"],
                      check=True, capture_output=True, text=True).stdout
with psycopg.connect(url, autocommit=True) as c:
    row = c.execute("SELECT format FROM eventlog.profiles WHERE id = %s", (pid,)).fetchone()
assert row is not None
lines = [ln for ln in dump.splitlines()
         if ln.strip() and not ln.startswith(("--", "\\", "SELECT pg_catalog.set_config"))]
text = "\n".join(lines).replace(role, "{role}").replace(schema, "{schema}")
print("-- Written by tests/data/make_pg_release1_profile.py with eventlog commit 1794d19; do not edit.")
print(f"CREATE ROLE {{role}} NOLOGIN;\n{text}")
print("INSERT INTO eventlog.profiles (id, name, schema_name, role_name, format) "
      f"VALUES ({{id}}, '{{name}}', '{{schema}}', '{{role}}', {int(row[0])});")
