"""PostgreSQL layout of the log: the profile registry, one schema and one role per profile.

Imported only by :mod:`eventlog.log.postgres` (and tests); needs psycopg 3 (``eventlog[postgres]``).

::

    eventlog.profiles   registry: name (a profile name, up to 64 characters: longer than
                        PostgreSQL's 63-byte identifiers allow, hence a table) -> schema, role
    eventlog.profile()  SECURITY DEFINER lookup: answers only for a profile whose role the
                        session user is a member of (no role learns another profile's schema)
    eventlog_p<N>.events   seq bigint PK, id text UNIQUE, session text, body bytea
                           (body: the event as eventlog.log.stored packs it)
    eventlog_p<N>.streams  session -> version (events in that session stream)
    eventlog_p<N>.head     one row: seq and hash of the last event (0 and 64 zeros when empty)
    eventlog_p<N>.zdicts   compression dictionaries by id (trained once on the log's own events)

The role ``eventlog_<database oid>_p<N>`` (NOLOGIN; grant it to the login roles of the hosts
that serve the profile) may read its schema, INSERT events, and INSERT/UPDATE only the
``streams`` and ``head`` rows: never UPDATE, DELETE or TRUNCATE an event. Tables belong to the
administrator who provisioned them. Every connection of :class:`~eventlog.log.postgres.PostgresLog`
runs ``SET ROLE`` to the profile's role, so even an administrator's URL appends with exactly
these rights.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg import sql

from eventlog.errors import DiskFullError, StorageError
from eventlog.log.pg_watch import WatchedConnection
from eventlog.profiles import validate_profile

REGISTRY = "eventlog"
BODY_FORMAT = 2
"""Stored representation of ``events.body`` for new profiles: the LMDB log's format 2
(:mod:`eventlog.log.stored`: a compact header and zstd-compressed data, the dictionary in the
profile's ``zdicts`` table). Format 1 (the canonical envelope bytes as they are) is read too."""
BODY_FORMATS = (1, 2)
LOCK_NAMESPACE = 0x65766C67
"""First key of every advisory lock eventlog takes ("evlg"); the second is the profile id (0: registry)."""
ERASE_MARK_KEY = "(erase mark)"
"""The ``streams`` row holding the profile's erase mark (the seq of the last ``log.erased``
record, :meth:`eventlog.log.postgres.PostgresLog.erase_mark`): not a session id (those never
hold parentheses or spaces), so no stream and no query of sessions meets it."""
URL_RE = re.compile(r"^postgres(ql)?://", re.IGNORECASE)


def is_url(target: object) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(target, str) and bool(URL_RE.match(target))


def redact(url: str) -> str:
    """The URL without its password, for messages: the userinfo's (up to the last ``@`` of the
    authority, so a raw ``/`` or ``@`` in it does not end it early) and a ``password=`` query
    parameter's; any URL or ``password=`` inside other text too (libpq quotes the URI it could
    not parse), and the token libpq quotes in "invalid percent-encoded token"."""
    text = _PASSWORD_PARAM.sub(r"\1***", _URL_IN_TEXT.sub(lambda m: _redact_one(m.group(0)), url))
    return _PERCENT_TOKEN.sub(r"\1***\2", text)


_PERCENT_TOKEN = re.compile(r'(invalid percent-encoded token: ")[^"]*(")?', re.IGNORECASE)
"""libpq quotes the URL token it could not percent-decode: a password, as likely as not."""
_URL_IN_TEXT = re.compile(r"postgres(?:ql)?://[^\s\"'<>]*", re.IGNORECASE)
_PASSWORD_PARAM = re.compile(r"(\bpassword\s*=\s*)(?:'[^']*'|[^\s&\"']*)", re.IGNORECASE)


def _redact_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    head, q, query = rest.partition("?")
    at = head.rfind("@")
    if at >= 0 and ":" in head[:at]:
        head = head[:at].split(":", 1)[0] + ":***" + head[at:]
    return scheme + sep + head + q + query


@dataclass(frozen=True)
class ProfileInfo:
    """One registry row: where a profile's log lives in the database."""

    id: int
    schema: str
    role: str
    format: int

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this profile's appends."""
        return f"{self.schema}_appended"


def storage_error(e: BaseException, action: str, where: str = "") -> StorageError:
    """The one place psycopg errors become eventlog errors (the caller chains the cause)."""
    at = f" ({where})" if where else ""
    text = redact(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__
    if isinstance(e, pgerr.DiskFull):
        return DiskFullError(f"{action}: the PostgreSQL server is out of disk space{at}",
                             hint="free space on the server, then retry: nothing of the failed append was written")
    if isinstance(e, pgerr.InsufficientPrivilege):
        return StorageError(f"{action}: permission denied{at}: {text}",
                            hint="the role lacks a privilege on this profile's schema; provision the profile "
                                 "with an administrator URL and grant its role to this login")
    if isinstance(e, (pgerr.QueryCanceled, pgerr.LockNotAvailable)):
        # The server answered: a timeout the administrator set (for the login, the database, or
        # in the URL's options) ended the statement. It said "cannot reach PostgreSQL".
        setting = "lock_timeout" if isinstance(e, pgerr.LockNotAvailable) else "statement_timeout"
        return StorageError(f"{action}: the server cancelled the statement{at}: {text}",
                            hint=f"a {setting} of this login, its database or the URL's options is shorter than an "
                                 f"eventlog statement (a wait for the profile's lock, a long read): raise it, or set "
                                 f"it to 0 for eventlog's login; or an administrator cancelled the statement")
    if isinstance(e, (pgerr.UndefinedTable, pgerr.UndefinedColumn, pgerr.UndefinedFunction, pgerr.InvalidSchemaName)):
        # The registry names the profile but its schema is not this release's layout: the hint
        # sent the operator to check the URL and the server, which were right.
        return StorageError(f"{action}{at}: {text}",
                            hint="the profile's schema on the server is not the layout this version of eventlog uses "
                                 "(a table, column or function dropped or changed by hand, or made by another "
                                 "version): restore it from a backup of the database")
    if isinstance(e, psycopg.OperationalError):
        return StorageError(f"{action}: cannot reach PostgreSQL{at}: {text}",
                            hint="check that the server is running and the URL, user and password are right")
    return StorageError(f"{action}{at}: {text}",
                        hint="check the PostgreSQL URL (postgresql://user:password@host:port/database) and the server")


APPLICATION_RE = re.compile(r"eventlog ([0-9]+)@(.*)")


def application_name() -> str:
    """What this process's connections tell the server: ``eventlog <pid>@<host>`` (PostgreSQL
    keeps 63 printable ASCII characters). A host waiting behind a lock is told which process of
    which host holds it (:func:`holder_text`), not only the server process serving it."""
    host = socket.gethostname().encode("ascii", "replace").decode()
    host = "".join(c if " " <= c <= "~" else "?" for c in host)
    return f"eventlog {os.getpid()}@{host}"[:63]


def holder_text(application: str | None, address: str | None) -> tuple[str, str]:
    """``(what, remedy)`` for the client behind a lock holder's server process, from its
    ``pg_stat_activity`` row: an eventlog process (by pid and host) or another application."""
    found = APPLICATION_RE.fullmatch(application or "")
    where = f" from {address}" if address else ""
    if found:
        pid, host = found.groups()
        return (f"for eventlog process {pid} on host {host}{where}",
                f"if that process is stopped, `kill -CONT {pid}` on {host}, or let the server end its "
                "transaction (idle_in_transaction_session_timeout)")
    if application:
        return f"for application {application!r}{where}", ""
    return (f"for a client{where}", "") if where else ("", "")


def connect(url: str, *, connect_timeout: float = 10.0, answer_timeout: float | None = None) -> psycopg.Connection[Any]:
    """An autocommit connection with keepalives (a dead server is noticed within ~20 s). The
    URL's scheme is matched in any case (RFC 3986), and handed to libpq in lower case: libpq
    took ``POSTGRESQL://...`` for a ``key=value`` string ('missing "=" after ...'). With an
    ``answer_timeout``, a statement the server leaves unanswered that long while the server also
    does not answer a new connection is cut (:mod:`eventlog.log.pg_watch`)."""
    found = URL_RE.match(url)
    if found:
        url = found.group(0).lower() + url[found.end():]
    conn = WatchedConnection.connect(url, autocommit=True, connect_timeout=max(1, int(connect_timeout)),
                                     application_name=application_name(), keepalives=1, keepalives_idle=10,
                                     keepalives_interval=5, keepalives_count=2)
    conn.probe_url, conn.probe_connect_timeout = url, connect_timeout
    conn.answer_timeout = answer_timeout
    return conn


def lookup(conn: psycopg.Connection[Any], profile: str) -> ProfileInfo | None:
    """The registry row of ``profile`` if this session may use it, else None."""
    try:
        row = conn.execute(f"SELECT id, schema_name, role_name, format FROM {REGISTRY}.profile(%s)",
                           (profile,)).fetchone()
    except pgerr.UndefinedFunction:
        return None
    except pgerr.InvalidSchemaName:
        return None
    return None if row is None else ProfileInfo(int(row[0]), str(row[1]), str(row[2]), int(row[3]))


_REGISTRY_DDL = [
    f"CREATE SCHEMA IF NOT EXISTS {REGISTRY}",
    f"""CREATE TABLE IF NOT EXISTS {REGISTRY}.profiles (
        id bigint PRIMARY KEY,
        name text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}$'),
        schema_name text NOT NULL UNIQUE,
        role_name text NOT NULL UNIQUE,
        format integer NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now())""",
    f"REVOKE ALL ON {REGISTRY}.profiles FROM PUBLIC",
    # Profile ids come from a sequence, which never goes back: a removed profile's id (hence its
    # schema, role and lock keys) is never given to another profile, so a handle still open on
    # the removed one cannot reach the next one's log.
    f"CREATE SEQUENCE IF NOT EXISTS {REGISTRY}.profile_ids",
    f"REVOKE ALL ON SEQUENCE {REGISTRY}.profile_ids FROM PUBLIC",
    f"GRANT USAGE ON SCHEMA {REGISTRY} TO PUBLIC",
    f"""CREATE OR REPLACE FUNCTION {REGISTRY}.profile(p text)
        RETURNS TABLE (id bigint, schema_name text, role_name text, format integer)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
          SELECT r.id, r.schema_name, r.role_name, r.format FROM {REGISTRY}.profiles r
          WHERE r.name = p
            AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r.role_name)
            AND pg_has_role(session_user, r.role_name, 'MEMBER') $$""",
    f"REVOKE ALL ON FUNCTION {REGISTRY}.profile(text) FROM PUBLIC",
    f"GRANT EXECUTE ON FUNCTION {REGISTRY}.profile(text) TO PUBLIC",
]


def _profile_ddl(schema: str, role: str) -> list[sql.Composed]:
    s, r = sql.Identifier(schema), sql.Identifier(role)
    zero = sql.Literal("0" * 64)
    return [
        sql.SQL("CREATE ROLE {} NOLOGIN").format(r),
        sql.SQL("CREATE SCHEMA {}").format(s),
        sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(s),
        sql.SQL("""CREATE TABLE {}.events (
            seq bigint PRIMARY KEY CHECK (seq > 0),
            id text NOT NULL UNIQUE,
            session text,
            body bytea NOT NULL)""").format(s),
        sql.SQL("CREATE INDEX ON {}.events (session, seq) WHERE session IS NOT NULL").format(s),
        sql.SQL("CREATE TABLE {}.streams (session text PRIMARY KEY, version bigint NOT NULL)").format(s),
        sql.SQL("""CREATE TABLE {}.head (
            single boolean PRIMARY KEY DEFAULT true CHECK (single),
            seq bigint NOT NULL,
            hash text NOT NULL)""").format(s),
        sql.SQL("INSERT INTO {}.head (single, seq, hash) VALUES (true, 0, {})").format(s, zero),
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r),
        sql.SQL("GRANT SELECT, INSERT ON {}.events TO {}").format(s, r),
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {}.streams TO {}").format(s, r),
        sql.SQL("GRANT SELECT, UPDATE ON {}.head TO {}").format(s, r),
        *zdicts_ddl(schema, role),
        *erase_function_ddl(schema, role),
    ]


def zdicts_ddl(schema: str, role: str) -> list[sql.Composed]:
    """The compression dictionaries' table (added after the first release: see :func:`upgrade`)."""
    s, r = sql.Identifier(schema), sql.Identifier(role)
    return [
        sql.SQL("CREATE TABLE IF NOT EXISTS {}.zdicts (id integer PRIMARY KEY CHECK (id > 0), "
                "dict bytea NOT NULL)").format(s),
        sql.SQL("GRANT SELECT, INSERT ON {}.zdicts TO {}").format(s, r),
    ]


def upgrade(conn: psycopg.Connection[Any], info: "ProfileInfo") -> bool:
    """Bring a profile provisioned by an earlier release up to this release's layout when this
    connection may (the schema's owner or a superuser): the ``zdicts`` table the first release
    did not create, and the current :func:`erase_function_ddl`. True when the layout is
    complete; False when something is missing and this login may not add it (the profile still
    works as far as its format needs: a format-1 profile never reads ``zdicts``)."""
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{info.schema}".zdicts',)).fetchone()
    complete = bool(found and found[0])
    if not complete:
        try:
            with conn.transaction():
                _upgrade_lock(conn)
                for ddl in zdicts_ddl(info.schema, info.role):
                    conn.execute(ddl)
            complete = True
        except (pgerr.InsufficientPrivilege, pgerr.InvalidSchemaName):
            pass
    return ensure_erase_function(conn, info) and complete


def _upgrade_lock(conn: psycopg.Connection[Any]) -> None:
    """Serialize the upgrades of administrators opening profiles at once (the registry's lock,
    until the transaction ends): two concurrent ``CREATE OR REPLACE FUNCTION`` of one function
    (or ``CREATE TABLE IF NOT EXISTS`` of one table) fail one of them ("tuple concurrently
    updated", a duplicate key in the catalog), and with it that host's open."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_NAMESPACE,))


ERASE_FUNCTION = "erase_events(bigint[], bytea[])"
ERASE_VERSION = "eventlog erase_events 3: stubs built from the event's own header; records never erased"


def erase_function_ddl(schema: str, role: str) -> list[sql.Composed]:
    """The one way the profile's role changes a stored event: ``erase_events(seqs, stubs)``, a
    SECURITY DEFINER function (it runs with the owner's rights; the role has no UPDATE on
    events). It replaces events by their stubs only in the transaction that has just appended
    the ``log.erased`` record naming them (that record is the head and this transaction wrote
    the head row; its data, stored uncompressed, lists each ``[seq, hash]`` erased), and never
    a ``log.erased`` record itself — so an erase is all or nothing and always audited
    (format-2 bodies). Each stub is built here from the stored event's own header (kind 3, cut
    where the data begins): the one the client sends must be that very stub, so no field of the
    erased event (session, type, id, ts) can be changed under its kept hash. The record's data
    is read as JSON with any U+0000 escape made another control character first (jsonb cannot
    hold U+0000; only the record's ``erased`` list is read)."""
    s, r = sql.Identifier(schema), sql.Identifier(role)
    body = sql.SQL("""CREATE OR REPLACE FUNCTION {s}.erase_events(seqs bigint[], stubs bytea[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  top bigint; rec bytea; old bytea; stub bytea; n integer := 0; i integer; at integer; h integer; named jsonb;
  erased_type constant bytea := decode('0a6c6f672e657261736564', 'hex');  -- length 10, 'log.erased'
BEGIN
  SELECT h.seq INTO top FROM {s}.head h WHERE h.xmin::text::bigint = txid_current() % 4294967296;
  SELECT e.body INTO rec FROM {s}.events e WHERE e.seq = top;
  IF rec IS NULL OR get_byte(rec, 0) <> 2 OR substring(rec FROM 76 FOR 11) <> erased_type THEN
    RAISE EXCEPTION 'eventlog: events are erased only with the log.erased record of the same transaction'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  -- The record's data: after its type (at 76), session (none: one byte) and id (a 16-byte hex
  -- id, or a length and the text), the codec (0: stored as it is) and dictionary, then JSON.
  at := 88 + CASE WHEN get_byte(rec, 87) = 0 THEN 17 ELSE 1 + get_byte(rec, 87) END;
  IF get_byte(rec, 86) <> 255 OR get_byte(rec, at - 1) <> 0 THEN
    RAISE EXCEPTION 'eventlog: the log.erased record must name the events it erases as plain data'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  SELECT jsonb_object_agg(x ->> 0, x ->> 1) INTO named
    FROM jsonb_array_elements(replace(convert_from(substring(rec FROM at + 3), 'UTF8'), '\\u0000', '\\u001f')::jsonb
                              -> 'erased') AS x;
  IF coalesce(array_length(seqs, 1), 0) <> coalesce(array_length(stubs, 1), 0) THEN
    RAISE EXCEPTION 'eventlog: one stub per seq' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  FOR i IN 1 .. coalesce(array_length(seqs, 1), 0) LOOP
    SELECT e.body INTO old FROM {s}.events e WHERE e.seq = seqs[i] FOR UPDATE;
    IF old IS NULL OR seqs[i] >= top OR get_byte(old, 0) <> 2 THEN
      RAISE EXCEPTION 'eventlog: event % cannot be erased', seqs[i] USING ERRCODE = 'check_violation';
    END IF;
    IF substring(old FROM 76 FOR 11) = erased_type THEN
      RAISE EXCEPTION 'eventlog: event % is a log.erased record: it is never erased', seqs[i]
        USING ERRCODE = 'insufficient_privilege';
    END IF;
    h := 76 + get_byte(old, 75);                                                         -- past the type
    h := h + CASE WHEN get_byte(old, h) = 255 THEN 1 ELSE 1 + get_byte(old, h) END;      -- the session
    h := h + CASE WHEN get_byte(old, h) = 0 THEN 17 ELSE 1 + get_byte(old, h) END;       -- the id
    stub := set_byte(substring(old FROM 1 FOR h), 0, 3);
    IF stubs[i] IS DISTINCT FROM stub THEN
      RAISE EXCEPTION 'eventlog: event % cannot take this stub (it must be the event''s own header)', seqs[i]
        USING ERRCODE = 'check_violation';
    END IF;
    IF named IS NULL OR (named ->> seqs[i]::text) IS DISTINCT FROM encode(substring(old FROM 2 FOR 32), 'hex') THEN
      RAISE EXCEPTION 'eventlog: the log.erased record does not name event %', seqs[i]
        USING ERRCODE = 'insufficient_privilege';
    END IF;
    UPDATE {s}.events SET body = stub WHERE seq = seqs[i];
    n := n + 1;
  END LOOP;
  RETURN n;
END
$fn$""").format(s=s)
    return [
        body,
        sql.SQL("COMMENT ON FUNCTION {}.erase_events(bigint[], bytea[]) IS {}").format(s, sql.Literal(ERASE_VERSION)),
        sql.SQL("REVOKE ALL ON FUNCTION {}.erase_events(bigint[], bytea[]) FROM PUBLIC").format(s),
        sql.SQL("GRANT EXECUTE ON FUNCTION {}.erase_events(bigint[], bytea[]) TO {}").format(s, r),
    ]


def erase_version(comment: object) -> int:
    """The version number an erase function's comment gives (``eventlog erase_events N: ...``);
    0 for none (the first release that had the function left no comment)."""
    found = re.match(r"eventlog erase_events (\d+)\b", comment) if isinstance(comment, str) else None
    return int(found.group(1)) if found else 0


def ensure_erase_function(conn: psycopg.Connection[Any], info: "ProfileInfo") -> bool:
    """Add :func:`erase_function_ddl` to a profile provisioned before it existed, or replace an
    earlier version of it, when this connection may (the schema's owner or a superuser); True
    when the function is there. A later release's version is left as it is: an administrator
    host not upgraded yet replaced it by its own, older one (and the upgraded hosts put theirs
    back, in turn)."""
    check = "SELECT to_regprocedure(%s) IS NOT NULL, obj_description(to_regprocedure(%s), 'pg_proc')"
    current = erase_version(ERASE_VERSION)
    found = conn.execute(check, (f'"{info.schema}".{ERASE_FUNCTION}',) * 2).fetchone()
    if found and found[0] and erase_version(found[1]) >= current:
        return True
    try:
        with conn.transaction():
            _upgrade_lock(conn)
            found = conn.execute(check, (f'"{info.schema}".{ERASE_FUNCTION}',) * 2).fetchone()
            if found and found[0] and erase_version(found[1]) >= current:
                return True  # another administrator's open upgraded it meanwhile
            for ddl in erase_function_ddl(info.schema, info.role):
                conn.execute(ddl)
    except (pgerr.InsufficientPrivilege, pgerr.InvalidSchemaName):
        return bool(found and found[0])  # an earlier version stays until its owner opens the log
    return True


def provision(conn: psycopg.Connection[Any], profile: str) -> ProfileInfo:
    """Create the registry (once per database) and ``profile``'s schema, tables and role, in one
    transaction; idempotent. Needs an administrator: CREATE on the database and CREATEROLE.
    Raises psycopg's InsufficientPrivilege otherwise (the caller converts it)."""
    validate_profile(profile)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_NAMESPACE,))
        for stmt in _REGISTRY_DDL:
            conn.execute(stmt)
        row = conn.execute(f"SELECT id, schema_name, role_name, format FROM {REGISTRY}.profiles WHERE name = %s",
                           (profile,)).fetchone()
        if row is not None:
            return ProfileInfo(int(row[0]), str(row[1]), str(row[2]), int(row[3]))
        dboid = int(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])  # type: ignore[index]
        pid, schema, role = _new_id(conn, dboid)
        for ddl in _profile_ddl(schema, role):
            conn.execute(ddl)
        member = conn.execute("SELECT pg_has_role(session_user, %s, 'MEMBER')", (role,)).fetchone()
        if not (member and member[0]):  # a CREATEROLE administrator (not superuser) before PG 16
            conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(
                str(conn.execute("SELECT session_user").fetchone()[0]))))  # type: ignore[index]
        conn.execute(f"INSERT INTO {REGISTRY}.profiles (id, name, schema_name, role_name, format) "
                     "VALUES (%s, %s, %s, %s, %s)", (pid, profile, schema, role, BODY_FORMAT))
    return ProfileInfo(pid, schema, role, BODY_FORMAT)


def _new_id(conn: psycopg.Connection[Any], dboid: int) -> tuple[int, str, str]:
    """A profile id never given before, with its schema and role names (under the registry lock).
    Past every id in the registry too: an earlier release took max(id) + 1, and may still be
    creating profiles beside this one. An id whose schema or role is there already (left behind
    by hand) is passed over."""
    while True:
        pid = int(conn.execute(  # type: ignore[index]
            f"SELECT setval('{REGISTRY}.profile_ids', greatest(nextval('{REGISTRY}.profile_ids'), "
            f"(SELECT coalesce(max(id), 0) + 1 FROM {REGISTRY}.profiles)))").fetchone()[0])
        schema, role = f"eventlog_p{pid}", f"eventlog_{dboid}_p{pid}"
        taken = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL OR EXISTS (SELECT 1 FROM pg_roles "
                             "WHERE rolname = %s)", (f'"{schema}"', role)).fetchone()
        if not (taken and taken[0]):
            return pid, schema, role


def drop_if_empty(conn: psycopg.Connection[Any], profile: str) -> bool:
    """Remove ``profile``'s schema, role and registry row if its log holds no event — what a
    refused first import leaves behind; True when removed. One transaction, under the registry
    lock, with the profile's tables locked: a writer that opened the profile meanwhile either
    appended first (then nothing is removed) or fails, so nothing acknowledged is lost. Needs
    the administrator that provisioned it; raises psycopg's errors (the caller decides)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_NAMESPACE,))
        row = conn.execute(f"SELECT schema_name, role_name FROM {REGISTRY}.profiles WHERE name = %s",
                           (profile,)).fetchone()
        if row is None:
            return False
        s, r = sql.Identifier(str(row[0])), sql.Identifier(str(row[1]))
        conn.execute(sql.SQL("LOCK TABLE {}.head, {}.events IN ACCESS EXCLUSIVE MODE").format(s, s))
        head = conn.execute(sql.SQL("SELECT seq FROM {}.head").format(s)).fetchone()
        held = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {}.events)").format(s)).fetchone()
        if head is None or head[0] != 0 or held is None or held[0]:
            return False
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(s))
        conn.execute(f"DELETE FROM {REGISTRY}.profiles WHERE name = %s", (profile,))
        conn.execute(sql.SQL("DROP ROLE {}").format(r))
    return True


def grant_login(conn: psycopg.Connection[Any], profile: str, login: str) -> ProfileInfo:
    """Let the login role ``login`` use ``profile`` (``GRANT <profile role> TO login``).
    Needs an administrator connection; raises :class:`StorageError` for an unknown profile or a
    connection that may not read the registry or grant the role."""
    try:
        row = conn.execute(f"SELECT id, schema_name, role_name, format FROM {REGISTRY}.profiles WHERE name = %s",
                           (profile,)).fetchone()
        if row is None:
            raise StorageError(f"profile {profile!r} is not provisioned on this database",
                               hint="open it once with an administrator URL (it is created on first open)")
        info = ProfileInfo(int(row[0]), str(row[1]), str(row[2]), int(row[3]))
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(info.role), sql.Identifier(login)))
    except psycopg.Error as e:
        err = storage_error(e, f"granting profile {profile!r} to {login!r} failed")
        if isinstance(e, pgerr.InsufficientPrivilege):
            err.hint = REGISTRY_OWNER_HINT
        raise err from e
    return info


REGISTRY_OWNER_HINT = (f"the {REGISTRY} schema and its profiles belong to the administrator that created them first: "
                       f"use that login, or have it run `GRANT <that login> TO <this one>` so both administer them")


class Statements:
    """The SQL of one profile's log, composed once (schema names quoted as identifiers)."""

    def __init__(self, info: ProfileInfo) -> None:
        s = sql.Identifier(info.schema)

        def q(text: str) -> str:
            return sql.SQL(text).format(s=s).as_string(None)

        self.set_role = sql.SQL("SET ROLE {}").format(sql.Identifier(info.role)).as_string(None)
        self.identity = f"SELECT id, schema_name, role_name FROM {REGISTRY}.profile(%s)"
        self.lock = "SELECT pg_advisory_xact_lock(%s, %s)"
        self.lock_args = (LOCK_NAMESPACE, info.id)
        # The rules lock (PostgresLog.rules_lock): which of these server pids still hold it.
        self.rules_args = (LOCK_NAMESPACE + 1, info.id)
        self.lock_holder = ("SELECT l.pid, a.application_name, host(a.client_addr) FROM pg_catalog.pg_locks l "
                            "LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
                            "AND l.classid = %s AND l.objid = %s AND l.objsubid = 2 AND l.granted LIMIT 1")  # lock_args
        self.rules_held = ("SELECT pid FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND classid = %s "
                           "AND objid = %s AND objsubid = 2 AND granted AND pid = ANY(%s::integer[])")
        self.head = q("SELECT seq, hash FROM {s}.head")
        # Format 1 (the first release's profiles, which may have no zdicts table) never compresses.
        self.head_and_dict = q("SELECT seq, hash, (SELECT max(id) FROM {s}.zdicts) FROM {s}.head" if info.format != 1
                               else "SELECT seq, hash, 0 FROM {s}.head")
        self.get_dict = q("SELECT dict FROM {s}.zdicts WHERE id = %s")
        self.add_dict = q("INSERT INTO {s}.zdicts (id, dict) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING")
        self.find_ids = q("SELECT id, seq, body FROM {s}.events WHERE id = ANY(%s::text[])")
        # A stream whose first and last events are erased stubs (kind 3: eventlog.log.stored) is
        # not the stream a writer counted before the erase, though the erase changed no version:
        # an append at an expected version to it is refused (as the LMDB log does).
        erased = ("coalesce((SELECT get_byte(e.body, 0) = 3 FROM {s}.events e WHERE e.session = {col} "
                  "ORDER BY e.seq LIMIT 1) AND (SELECT get_byte(e.body, 0) = 3 FROM {s}.events e "
                  "WHERE e.session = {col} ORDER BY e.seq DESC LIMIT 1), false)")
        self.versions = q("SELECT st.session, st.version, " + erased.replace("{col}", "st.session")
                          + " FROM {s}.streams st WHERE st.session = ANY(%s::text[])")
        # The writes of one append in one statement: the events, the stream versions, the head.
        writes = ("WITH ins AS (INSERT INTO {s}.events (seq, id, session, body) "
                  "SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bytea[])), "
                  "bump AS (INSERT INTO {s}.streams (session, version) SELECT * FROM unnest(%s::text[], %s::bigint[]) "
                  "ON CONFLICT (session) DO UPDATE SET version = streams.version + EXCLUDED.version) ")
        self.write = q(writes + "UPDATE {s}.head SET seq = %s, hash = %s")
        self.insert_events = q("INSERT INTO {s}.events (seq, id, session, body) "
                               "SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bytea[])")
        # The one-round-trip append also checks that the head (and each guarded stream's version)
        # is what it was sealed on: a failed check divides by zero and the whole statement fails.
        self.write_guarded = q(
            "WITH guard_head AS (SELECT 1 / count(*)::integer AS ok FROM {s}.head WHERE seq = %s AND hash = %s), "
            "guard_streams AS (SELECT 1 / (count(*) FILTER (WHERE coalesce(st.version, 0) <> g.version OR "
            + erased.replace("{col}", "g.session") + ") = 0)::integer "
            "AS ok FROM unnest(%s::text[], %s::bigint[]) AS g(session, version) "
            "LEFT JOIN {s}.streams st ON st.session = g.session), "
            + writes[len("WITH "):]
            + "UPDATE {s}.head SET seq = %s, hash = %s FROM guard_head, guard_streams "
              "WHERE guard_head.ok = 1 AND guard_streams.ok = 1")
        self.read = q("SELECT seq, body FROM {s}.events WHERE seq >= %s ORDER BY seq LIMIT %s")
        self.read_to = q("SELECT seq, body FROM {s}.events WHERE seq >= %s AND seq <= %s ORDER BY seq LIMIT %s")
        self.read_all = q("SELECT seq, body FROM {s}.events ORDER BY seq")
        self.get = q("SELECT body FROM {s}.events WHERE seq = %s")
        self.session = q("SELECT seq, body FROM {s}.events WHERE session = %s AND seq > %s ORDER BY seq LIMIT %s")
        self.version = q("SELECT version FROM {s}.streams WHERE session = %s")
        self.stream_state = q("SELECT session, version FROM {s}.streams WHERE session IN (%s, %s)")
        self.set_erase_mark = q("INSERT INTO {s}.streams (session, version) VALUES (%s, %s) ON CONFLICT (session) "
                                "DO UPDATE SET version = greatest(streams.version, EXCLUDED.version)")
        self.event_seq = q("SELECT seq FROM {s}.events WHERE id = %s")
        self.erase_rows = q("SELECT seq, body FROM {s}.events WHERE seq = ANY(%s::bigint[]) ORDER BY seq")
        self.stream_seqs = q("SELECT seq FROM {s}.events WHERE session = ANY(%s::text[])")
        self.erase = q("SELECT {s}.erase_events(%s::bigint[], %s::bytea[])")
        self.size = q("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                      "JOIN pg_namespace n ON n.oid = c.relnamespace "
                      "WHERE n.nspname = %s AND c.relkind = 'r'")
        self.notify = "SELECT pg_notify(%s, %s)"
        self.listen = sql.SQL("LISTEN {}").format(sql.Identifier(info.channel)).as_string(None)
