"""The Hermes fold: one log envelope applied to a connection on the Hermes schema.

:func:`apply` is pure in the sense projections need: its effect depends only on the envelope
and the rows already there, never on the clock, the process or the file. It works inside the
caller's transaction (the connection must have ``foreign_keys=ON``, as Hermes' own has: the
cascades of ``session_model_usage`` and the topic bindings, and the refusals of orphan rows,
are part of the rules). It returns what the Hermes method that wrote the event returns
(``rowcount``-style results, the new message id) so the writer can answer its caller from the
same code that a rebuild runs. Unknown types are ignored (a newer program's events).

Each rule states the Hermes 0.19.0 behaviour it reproduces; see docs/HERMES.md for the table.
"""
from __future__ import annotations

import json
import logging
import sqlite3
from typing import Any, Callable, Iterable

from eventlog.adapters.hermes import schema
from eventlog.adapters.hermes.events import from_json, map_session_id, session_of

log = logging.getLogger("eventlog.adapters.hermes")
Handler = Callable[[sqlite3.Connection, Any, dict[str, Any]], Any]
_HANDLERS: dict[str, Handler] = {}

RECOVERABLE_END_REASONS = ("agent_close", "ws_orphan_reap")


def apply(conn: sqlite3.Connection, envelope: dict[str, Any], seq: int | None = None) -> Any:
    """Apply one envelope (its ``type``, ``session`` and ``data``); returns the handler's result.
    ``seq``: the seq a live write's event will get (a replayed envelope carries its own).
    Raises what SQLite raises for a row the rules refuse (the writer turns that into the
    caller's exception; a replay skips the event)."""
    kind = envelope.get("type")
    handler = _HANDLERS.get(kind)  # type: ignore[arg-type]
    if handler is None:
        return None
    data = envelope.get("data")
    if type(data) is not dict:
        return None
    if "seq" in envelope and "parent_session_id" in data and kind in _LINKING:
        data = _orphaned_if_erased(conn, data, session_of(envelope))
    if kind == "hermes.sessions_deleted":
        return _deleted(conn, session_of(envelope), data, envelope.get("seq", seq))
    return handler(conn, session_of(envelope), data)


_LINKING = frozenset({"session.created", "hermes.session_enriched"})


def _orphaned_if_erased(conn: sqlite3.Connection, data: dict[str, Any], sid: Any) -> dict[str, Any]:
    """A replayed link to a parent that does not exist, without it. Hermes links only to an
    existing session (a live write to a missing parent fails on the foreign key and is never
    logged), so in a replay a missing parent was deleted later and its events erased: Hermes
    orphaned the child then (``parent_session_id`` NULL), which is what the rebuild gives back.
    A session naming itself is its own existing parent (the foreign key holds once its row is
    in; the differential test found the replay had dropped such a link)."""
    parent = from_json(data["parent_session_id"])
    if parent is None or parent == sid or conn.execute("SELECT 1 FROM sessions WHERE id = ?", (parent,)).fetchone():
        return data
    return {k: v for k, v in data.items() if k != "parent_session_id"}


def rule(*types: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for t in types:
            _HANDLERS[t] = fn
        return fn
    return register


def _v(d: dict[str, Any], key: str, default: Any = None) -> Any:
    return from_json(d[key]) if key in d else default


# ---- sessions -------------------------------------------------------------------------------

_CREATED_FIELDS = ("source", "user_id", "session_key", "chat_id", "chat_type", "thread_id", "model",
                   "model_config_json", "system_prompt", "parent_session_id", "cwd", "profile_name", "started_at")
_CREATED_COLUMNS = tuple("model_config" if f == "model_config_json" else f for f in _CREATED_FIELDS)
_INSERT_SESSION = (f"INSERT INTO sessions (id, {', '.join(_CREATED_COLUMNS)}) "
                   f"VALUES ({', '.join('?' * (1 + len(_CREATED_COLUMNS)))})")
ENRICHABLE = ("model", "model_config", "system_prompt", "session_key", "chat_id", "chat_type", "thread_id",
              "parent_session_id", "cwd", "profile_name")
"""Columns a repeated create fills in when they are still NULL (Hermes' insert-or-enrich)."""


def _insert_imported(conn: sqlite3.Connection, table: str, fixed: dict[str, Any], d: dict[str, Any],
                     allowed: frozenset[str], renamed: dict[str, str]) -> int:
    """A row copied from a Hermes database (``imported: true``): the columns it carries, as stored
    (a column's ``<name>_json`` text wins over the decoded copy given for eventlog's fold)."""
    row = dict(fixed)
    for key, value in d.items():
        column = renamed.get(key, key)
        if column in allowed and (column not in row or key != column):
            row[column] = from_json(value)
    inserted = _insert_or_ignore(conn, table, row)
    if inserted or table not in ("sessions", "messages"):
        return inserted
    # Ignored: the row is here already (nothing to do), or a key of its source database was
    # given to another row of this profile since the copy was made -- a later copy of Hermes'
    # own file imported after the facade wrote (a user who went back to plain Hermes and
    # returned). Such a row was dropped from this projection while eventlog's own view showed it.
    if table == "messages":
        same = ("session_id", "role", "content", "timestamp")
        held = conn.execute(f"SELECT {', '.join(same)} FROM messages WHERE id = ?", (row.get("id"),)).fetchone()
        if held is None or tuple(held) == tuple(row.get(c) for c in same):
            return 0
        log.warning("hermes projection: imported message %s of session %r takes a new id: a message of session %r"
                    " has that one", row.get("id"), row["session_id"], held[0])
        return _insert_or_ignore(conn, table, {k: v for k, v in row.items() if k != "id"})
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (row["id"],)).fetchone() is not None:
        return 0
    if row.get("title") is not None and conn.execute("SELECT 1 FROM sessions WHERE title = ?",
                                                     (row["title"],)).fetchone() is not None:
        log.warning("hermes projection: imported session %r is untitled: another session holds %r", row["id"],
                    row["title"])
        row["title"] = None
    if "rowid" in row and conn.execute("SELECT 1 FROM sessions WHERE rowid = ?", (row["rowid"],)).fetchone():
        del row["rowid"]
    return _insert_or_ignore(conn, table, row)


def _insert_or_ignore(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> int:
    sql = f"INSERT OR IGNORE INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})"
    return conn.execute(sql, tuple(row.values())).rowcount


_SESSION_IMPORTED = frozenset(schema.SESSION_NAMES) - {"id", "parent_session_id"}
_MESSAGE_IMPORTED = frozenset(schema.MESSAGE_NAMES) - {"session_id"}
_USAGE_IMPORTED = frozenset(c for c, _ in schema.USAGE_COLUMNS) - {"session_id"}
_JSON_RENAMES = {"tool_calls_json": "tool_calls", "reasoning_details_json": "reasoning_details",
                 "codex_reasoning_items_json": "codex_reasoning_items",
                 "codex_message_items_json": "codex_message_items"}


@rule("session.created")
def _session_created(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """A new row; if the id exists meanwhile, the create only fills its NULL columns. An imported
    row is copied as stored (its parent link follows in ``hermes.parents_attached``)."""
    if d.get("imported"):
        fixed = {"id": sid, **({"rowid": d["rowid"]} if "rowid" in d else {})}
        return _insert_imported(conn, "sessions", fixed, d, _SESSION_IMPORTED, {"model_config_json": "model_config"})
    values = [_v(d, f) for f in _CREATED_FIELDS]
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None:
        conn.execute(_INSERT_SESSION, (sid, *values))
        return 1
    given = dict(zip(_CREATED_COLUMNS, values))
    return _enrich(conn, sid, {c: given[c] for c in ENRICHABLE if given[c] is not None})


@rule("hermes.session_enriched")
def _session_enriched(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _enrich(conn, sid, {c: _v(d, c) for c in ENRICHABLE if c in d})


def _enrich(conn: sqlite3.Connection, sid: Any, values: dict[str, Any]) -> int:
    if not values:
        return 0
    sets = ", ".join(f"{c} = COALESCE({c}, ?)" for c in values)
    return conn.execute(f"UPDATE sessions SET {sets} WHERE id = ?", (*values.values(), sid)).rowcount


@rule("hermes.peer_recorded")
def _peer_recorded(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Routing columns replaced; display name and origin only when given."""
    return conn.execute(
        "UPDATE sessions SET session_key = ?, source = ?, user_id = ?, chat_id = ?, chat_type = ?, thread_id = ?,"
        " display_name = COALESCE(?, display_name), origin_json = COALESCE(?, origin_json) WHERE id = ?",
        (*(_v(d, k) for k in ("session_key", "source", "user_id", "chat_id", "chat_type", "thread_id",
                              "display_name", "origin_json")), sid)).rowcount


def _set_columns(conn: sqlite3.Connection, sid: Any, values: dict[str, Any]) -> int:
    sets = ", ".join(f"{c} = ?" for c in values)
    return conn.execute(f"UPDATE sessions SET {sets} WHERE id = ?", (*values.values(), sid)).rowcount


@rule("hermes.expiry_flag_set")
def _expiry(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"expiry_finalized": _v(d, "value")})


@rule("session.ended")
def _ended(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """First end wins: an ended session keeps its reason until reopened."""
    return conn.execute("UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                        (_v(d, "ended_at"), _v(d, "reason"), sid)).rowcount


@rule("session.reopened")
def _reopened(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"ended_at": None, "end_reason": None})


@rule("hermes.session_reset")
def _reset(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Ends live rows and re-ends rows closed by a recoverable accident, with the reset's reason."""
    return conn.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND (ended_at IS NULL OR end_reason IN (?, ?))",
        (_v(d, "ended_at"), _v(d, "reason"), sid, *RECOVERABLE_END_REASONS)).rowcount


@rule("session.meta_updated")
def _meta_updated(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """The given columns replaced (Hermes: a model switch; a frontend's cwd, branch and repo root)."""
    values: dict[str, Any] = {c: _v(d, c) for c in ("model", "cwd", "git_branch", "git_repo_root") if c in d}
    return _set_columns(conn, sid, values) if values else 0


@rule("hermes.repo_roots_backfilled")
def _roots(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Each (root, cwd): sessions in that cwd without a root get it."""
    n = 0
    for root, cwd in d.get("pairs") or []:
        n += conn.execute("UPDATE sessions SET git_repo_root = ? WHERE cwd = ? AND COALESCE(git_repo_root, '') = ''",
                          (from_json(root), from_json(cwd))).rowcount
    return n


@rule("hermes.compression_cooldown_set")
def _cooldown(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"compression_failure_cooldown_until": _v(d, "until"),
                                    "compression_failure_error": _v(d, "error")})


@rule("hermes.compression_cooldown_cleared")
def _cooldown_cleared(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"compression_failure_cooldown_until": None, "compression_failure_error": None})


@rule("hermes.fallback_streak_set")
def _streak(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"compression_fallback_streak": _v(d, "streak")})


@rule("hermes.model_config_set")
def _model_config(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """model_config replaced; model only when given."""
    return conn.execute("UPDATE sessions SET model_config = ?, model = COALESCE(?, model) WHERE id = ?",
                        (_v(d, "model_config_json"), _v(d, "model"), sid)).rowcount


@rule("hermes.system_prompt_set")
def _system_prompt(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"system_prompt": _v(d, "system_prompt")})


@rule("hermes.billing_route_set")
def _billing_route(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Provider and base URL replaced, mode only when given; the cached system prompt (which names
    the old route) is dropped."""
    return conn.execute(
        "UPDATE sessions SET billing_provider = ?, billing_base_url = ?, billing_mode = COALESCE(?, billing_mode),"
        " system_prompt = NULL WHERE id = ?",
        (_v(d, "provider"), _v(d, "base_url"), _v(d, "billing_mode"), sid)).rowcount


# ---- titles and archive -------------------------------------------------------------------

def compression_ancestors(conn: sqlite3.Connection, sid: Any) -> list[Any]:
    """``sid`` and the sessions above it reached through compression edges (a parent that ended
    with reason 'compression'), nearest first. Walked one parent at a time with the ids seen so far:
    Hermes accepts a session that is its own parent (or a longer loop), and a recursive query
    that counts depth never ends on one — inside a write, holding every writer of the profile."""
    out, seen = [sid], {sid}
    while True:
        row = conn.execute("SELECT p.id FROM sessions c JOIN sessions p ON p.id = c.parent_session_id"
                           " WHERE c.id = ? AND p.end_reason = 'compression'", (out[-1],)).fetchone()
        if row is None or row[0] in seen:
            return out
        out.append(row[0])
        seen.add(row[0])


@rule("session.titled")
def _titled(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """A title is unique: held by another session it is refused (ValueError), except when that
    session is a compression ancestor of this one, which hands it over. ``only_if_empty``
    (automatic titles) sets it only on an untitled session."""
    title = _v(d, "title")
    if d.get("imported"):  # an import's title: the imported row has it already, unless renamed since
        row = conn.execute("SELECT title FROM sessions WHERE id = ?", (sid,)).fetchone()
        if row is None or row[0] == title:
            return 0
    only_if_empty = bool(d.get("only_if_empty"))
    if only_if_empty:
        row = conn.execute("SELECT title FROM sessions WHERE id = ?", (sid,)).fetchone()
        if row is None or row[0] is not None:
            return 0
    if title:
        holder = conn.execute("SELECT id FROM sessions WHERE title = ? AND id != ?", (title, sid)).fetchone()
        if holder is not None:
            if holder[0] != sid and holder[0] in compression_ancestors(conn, sid):
                conn.execute("UPDATE sessions SET title = NULL WHERE id = ?", (holder[0],))
            else:
                raise ValueError(f"Title '{title}' is already in use by session {holder[0]}")
    guard = " AND title IS NULL" if only_if_empty else ""
    return conn.execute(f"UPDATE sessions SET title = ? WHERE id = ?{guard}", (title, sid)).rowcount


@rule("hermes.title_cleared")
def _title_cleared(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    guard = " AND title IS NULL" if d.get("only_if_empty") else ""
    return conn.execute(f"UPDATE sessions SET title = NULL WHERE id = ?{guard}", (sid,)).rowcount


def compression_lineage(conn: sqlite3.Connection, sid: Any) -> list[Any]:
    """Every session of ``sid``'s compression chain: ancestors through compression edges and
    descendants below sessions that ended with 'compression'."""
    rows = conn.execute(
        "WITH RECURSIVE up(id) AS (SELECT ? UNION SELECT p.id FROM up JOIN sessions c ON c.id = up.id"
        " JOIN sessions p ON p.id = c.parent_session_id WHERE p.end_reason = 'compression'),"
        " down(id) AS (SELECT ? UNION SELECT c.id FROM down JOIN sessions p ON p.id = down.id"
        " JOIN sessions c ON c.parent_session_id = p.id WHERE p.end_reason = 'compression')"
        " SELECT id FROM up UNION SELECT id FROM down", (sid, sid)).fetchall()
    return [r[0] for r in rows]


def _archive(conn: sqlite3.Connection, sid: Any, flag: int) -> int:
    members = compression_lineage(conn, sid)
    return conn.execute(f"UPDATE sessions SET archived = ? WHERE id IN ({','.join('?' * len(members))})",
                        (flag, *members)).rowcount


@rule("session.archived")
def _archived(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """The whole compression chain is archived (an unarchived root would resurface its tip). An
    imported flag is already in its imported row. ``alone``: this session only (the writer
    emitted one such event per member of the chain, each in its member's stream); without it
    (logs written before), the chain as the projection has it when the event is applied."""
    if d.get("imported"):
        return 0
    return _archive_one(conn, sid, 1) if d.get("alone") else _archive(conn, sid, 1)


@rule("session.unarchived")
def _unarchived(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _archive_one(conn, sid, 0) if d.get("alone") else _archive(conn, sid, 0)


def _archive_one(conn: sqlite3.Connection, sid: Any, flag: int) -> int:
    return conn.execute("UPDATE sessions SET archived = ? WHERE id = ?", (flag, sid)).rowcount


# ---- usage ---------------------------------------------------------------------------------

_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")


@rule("usage.recorded", "hermes.usage_totals_set")
def _usage(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """One LLM call's usage.

    Main-loop usage (no ``task``) updates the session's totals — added, or for
    ``hermes.usage_totals_set`` replaced by the caller's cumulative totals — and fills the route
    (model, provider, base URL, mode) where still unknown; the first accounted call of a session
    whose route differs from the one requested at creation replaces it whole. Incremental usage
    also accumulates in ``session_model_usage`` per (model, route, task); auxiliary usage
    (``task`` set) goes only there, under its own route.
    """
    if d.get("imported"):
        return _insert_imported(conn, "session_model_usage", {"session_id": sid}, d, _USAGE_IMPORTED, {})
    g = d.get
    tokens = [from_json(g(k, 0)) for k in _TOKEN_FIELDS]
    est, act = _v(d, "estimated_cost_usd"), _v(d, "actual_cost_usd")
    model, provider, base_url, mode = _v(d, "model"), _v(d, "provider"), _v(d, "base_url"), _v(d, "billing_mode")
    calls = from_json(g("api_call_count", 0))
    task = _v(d, "task") or ""  # bytes and +-inf travel encoded (sql_value), as Hermes stores them
    changed = 0
    if not task:
        accounted = bool(g("accounted"))
        row = conn.execute("SELECT model, billing_provider, api_call_count FROM sessions WHERE id = ?",
                           (sid,)).fetchone()
        known_model, known_provider, known_calls = (row[0], row[1], int(row[2] or 0)) if row else (None, None, 0)
        if (known_calls == 0 and accounted and model and provider
                and (known_model != model or known_provider != provider)):
            _set_columns(conn, sid, {"model": model, "billing_provider": provider,
                                     "billing_base_url": base_url, "billing_mode": mode})
        route = (provider, base_url, mode, model) if accounted else (None, None, None, None)
        statuses = (_v(d, "cost_status"), _v(d, "cost_source"), _v(d, "pricing_version"))
        if g("absolute"):
            counters = ", ".join(f"{k} = ?" for k in _TOKEN_FIELDS)
            sql = (f"UPDATE sessions SET {counters}, estimated_cost_usd = COALESCE(?, 0),"
                   " actual_cost_usd = CASE WHEN ? IS NULL THEN actual_cost_usd ELSE ? END, ")
            calls_sql = "api_call_count = ?"
        else:
            counters = ", ".join(f"{k} = {k} + ?" for k in _TOKEN_FIELDS)
            sql = (f"UPDATE sessions SET {counters}, estimated_cost_usd = COALESCE(estimated_cost_usd, 0) + COALESCE(?, 0),"
                   " actual_cost_usd = CASE WHEN ? IS NULL THEN actual_cost_usd ELSE COALESCE(actual_cost_usd, 0) + ? END, ")
            calls_sql = "api_call_count = COALESCE(api_call_count, 0) + ?"
        sql += ("cost_status = COALESCE(?, cost_status), cost_source = COALESCE(?, cost_source),"
                " pricing_version = COALESCE(?, pricing_version), billing_provider = COALESCE(billing_provider, ?),"
                " billing_base_url = COALESCE(billing_base_url, ?), billing_mode = COALESCE(billing_mode, ?),"
                f" model = COALESCE(model, ?), {calls_sql} WHERE id = ?")
        changed = conn.execute(sql, (*tokens, est, act, act, *statuses, *route, calls, sid)).rowcount
        if not g("per_model"):
            return changed
        session_route = conn.execute(
            "SELECT model, billing_provider, billing_base_url, billing_mode FROM sessions WHERE id = ?",
            (sid,)).fetchone() or (None, None, None, None)
        key_model = model or session_route[0] or "unknown"
        key_route = (provider or session_route[1] or "", base_url or session_route[2] or "",
                     mode or session_route[3] or "")
    else:
        key_model = model or "unknown"
        key_route = (provider or "", base_url or "", mode or "")
    now = _v(d, "now")
    conn.execute(
        "INSERT INTO session_model_usage (session_id, model, billing_provider, billing_base_url, billing_mode, task,"
        " api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,"
        " estimated_cost_usd, actual_cost_usd, cost_status, cost_source, first_seen, last_seen)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        f" ON CONFLICT({', '.join(schema.USAGE_KEY)}) DO UPDATE SET"
        " api_call_count = api_call_count + excluded.api_call_count,"
        " input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens,"
        " cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens,"
        " cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens,"
        " reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,"
        " estimated_cost_usd = estimated_cost_usd + excluded.estimated_cost_usd,"
        " actual_cost_usd = actual_cost_usd + excluded.actual_cost_usd,"
        " cost_status = COALESCE(excluded.cost_status, cost_status),"
        " cost_source = COALESCE(excluded.cost_source, cost_source), last_seen = excluded.last_seen",
        (sid, key_model, *key_route, task, calls or 0, *(t or 0 for t in tokens), float(est or 0.0),
         float(act or 0.0), _v(d, "cost_status"), _v(d, "cost_source"), now, now))
    return changed + 1


# ---- messages ------------------------------------------------------------------------------

MESSAGE_FIELDS = ("id", "role", "content", "tool_call_id", "tool_calls", "tool_name", "effect_disposition",
                  "timestamp", "token_count", "finish_reason", "reasoning", "reasoning_content",
                  "reasoning_details", "codex_reasoning_items", "codex_message_items", "platform_message_id",
                  "observed", "api_content")
_JSON_FIELDS = frozenset({"tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items"})
_INSERT_MESSAGE = (f"INSERT INTO messages (session_id, {', '.join(MESSAGE_FIELDS)}, active)"
                   f" VALUES ({', '.join('?' * (len(MESSAGE_FIELDS) + 2))})")
CONTENT_JSON_PREFIX = "\x00json:"


def message_row(m: dict[str, Any]) -> list[Any]:
    """The column values of a message as event data holds them (``<field>_json`` keys carry JSON
    text; ``content_json`` is content stored with Hermes' structured-content sentinel)."""
    out = []
    for f in MESSAGE_FIELDS:
        if f in _JSON_FIELDS:
            out.append(_v(m, f + "_json"))
        elif f == "content" and "content_json" in m:
            out.append(CONTENT_JSON_PREFIX + m["content_json"])
        elif f == "observed":
            out.append(from_json(m.get("observed", 0)))
        else:
            out.append(_v(m, f))
    return out


def next_message_id(conn: sqlite3.Connection) -> int:
    """The id the next inserted message gets (the AUTOINCREMENT sequence's next value): a writer
    records it in the event, so a replay gives the same id."""
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
    return int(row[0] if row else 0) + 1


def numbered(conn: sqlite3.Connection, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages inserted together (replace, compaction, import), each with the id its insert
    gets now (the next of the AUTOINCREMENT sequence), for its event to record: replayed after
    an erase removed earlier rows, the sequence would be lower there and the ids would differ
    (found by the differential test). Events written before carry no ids: the sequence decides."""
    first = next_message_id(conn)
    return [{**m, "id": first + i} for i, m in enumerate(messages)]


def _insert_messages(conn: sqlite3.Connection, sid: Any, messages: Iterable[dict[str, Any]]) -> tuple[int, int]:
    n = calls = 0
    for m in messages:
        conn.execute(_INSERT_MESSAGE, (sid, *message_row(m), 1))
        n += 1
        calls += int(m.get("n_tool_calls", 0))
    return n, calls


@rule("message.appended")
def _appended(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """One message row (the id chosen by its writer) and the session's counters; an imported
    row is copied as stored (the imported session row already holds its counters)."""
    if d.get("imported"):
        if "content_json" in d:
            d = {**d, "content_text": CONTENT_JSON_PREFIX + d["content_json"]}
        return _insert_imported(conn, "messages", {"session_id": sid}, d, _MESSAGE_IMPORTED,
                                {**_JSON_RENAMES, "content_text": "content"})
    conn.execute(_INSERT_MESSAGE, (sid, *message_row(d), 1))
    calls = d.get("n_tool_calls", 0)
    if calls:
        conn.execute("UPDATE sessions SET message_count = message_count + 1, tool_call_count = tool_call_count + ?"
                     " WHERE id = ?", (calls, sid))
    else:
        conn.execute("UPDATE sessions SET message_count = message_count + 1 WHERE id = ?", (sid,))
    return int(d["id"])


def _set_counts(conn: sqlite3.Connection, sid: Any, n: int, calls: int) -> None:
    conn.execute("UPDATE sessions SET message_count = ?, tool_call_count = ? WHERE id = ?", (n, calls, sid))


@rule("hermes.messages_replaced")
def _replaced(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """The session's messages (or only its active ones) deleted and the given ones inserted."""
    active = " AND active = 1" if d.get("active_only") else ""
    conn.execute(f"DELETE FROM messages WHERE session_id = ?{active}", (sid,))
    _set_counts(conn, sid, 0, 0)
    n, calls = _insert_messages(conn, sid, d.get("messages") or [])
    _set_counts(conn, sid, n, calls)
    return n


@rule("hermes.messages_compacted")
def _compacted(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Active messages archived as compacted (kept, searchable, not replayed), the compacted
    transcript inserted as the new active set."""
    conn.execute("UPDATE messages SET active = 0, compacted = 1 WHERE session_id = ? AND active = 1", (sid,))
    n, calls = _insert_messages(conn, sid, d.get("messages") or [])
    _set_counts(conn, sid, n, calls)
    return n


@rule("hermes.messages_cleared")
def _cleared(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    n = conn.execute("DELETE FROM messages WHERE session_id = ?", (sid,)).rowcount
    return n + conn.execute("UPDATE sessions SET message_count = 0, tool_call_count = 0 WHERE id = ?",
                            (sid,)).rowcount


@rule("hermes.api_content_set")
def _api_content(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """The API-content sidecar on the newest active user message, if its content is the given one."""
    return conn.execute(
        "UPDATE messages SET api_content = ? WHERE id = (SELECT id FROM messages WHERE session_id = ?"
        " AND role = 'user' AND active = 1 ORDER BY id DESC LIMIT 1) AND content IS ?",
        (_v(d, "api_content"), sid, message_row(d)[2])).rowcount


@rule("hermes.messages_rewound")
def _rewound(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> list[int]:
    """Active messages from ``message_id`` on become inactive; the session's rewind count grows."""
    target = _v(d, "message_id")
    ids = [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? AND id >= ? AND active = 1",
                                      (sid, target))]
    if ids:
        conn.execute(f"UPDATE messages SET active = 0 WHERE id IN ({','.join('?' * len(ids))})", ids)
    conn.execute("UPDATE sessions SET rewind_count = COALESCE(rewind_count, 0) + 1 WHERE id = ?", (sid,))
    return ids


@rule("hermes.messages_restored")
def _restored(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    ids = [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? AND id >= ? AND active = 0",
                                      (sid, _v(d, "since")))]
    if ids:
        conn.execute(f"UPDATE messages SET active = 1 WHERE id IN ({','.join('?' * len(ids))})", ids)
    return len(ids)


# ---- deletion ------------------------------------------------------------------------------

def delegate_children(conn: sqlite3.Connection, parents: list[Any]) -> list[Any]:
    """Delegate subagent sessions below ``parents`` (marked ``_delegate_from`` in model_config and
    hanging off a parent by that marker or by parent link), recursively; never the parents."""
    marker = "json_extract(COALESCE(model_config, '{}'), '$._delegate_from')"
    found = {p for p in parents if p}
    seeds = set(found)
    frontier = list(found)
    while frontier:
        marks = ",".join("?" * len(frontier))
        rows = conn.execute(f"SELECT id FROM sessions WHERE {marker} IN ({marks})"
                            f" OR (parent_session_id IN ({marks}) AND {marker} IS NOT NULL)", frontier + frontier)
        frontier = [r[0] for r in rows if r[0] not in found]
        found.update(frontier)
    return [s for s in found if s not in seeds]


def _deleted(conn: sqlite3.Connection, sid: Any, d: dict[str, Any], seq: int | None = None) -> list[Any]:
    """Sessions deleted with their messages (usage and topic bindings cascade).

    ``delegates``: their delegate subagents go too. ``orphan``: surviving children lose their
    parent link. A plain delete (neither) is Hermes' ghost-session sweep. ``if_empty``: only an
    untitled session without messages or children. Returns the ids actually deleted, each now
    due for erase up to ``seq`` (this event's)."""
    ids = [from_json(x) for x in d.get("ids") or []]
    ids = [r[0] for r in conn.execute(f"SELECT id FROM sessions WHERE id IN ({','.join('?' * len(ids))})", ids)]
    if d.get("if_empty"):
        gone = [s for s in ids if conn.execute(
            "DELETE FROM sessions WHERE id = ? AND title IS NULL AND NOT EXISTS (SELECT 1 FROM messages m WHERE"
            " m.session_id = sessions.id) AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_session_id ="
            " sessions.id)", (s,)).rowcount]
        _erase_due(conn, add=gone, at=seq)
        return gone
    if not ids:
        return []
    gone = list(ids)
    if d.get("delegates"):
        extra = delegate_children(conn, ids)
        if extra:
            marks = ",".join("?" * len(extra))
            conn.execute(f"DELETE FROM messages WHERE session_id IN ({marks})", extra)
            conn.execute(f"UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IN ({marks})", extra)
            conn.execute(f"DELETE FROM sessions WHERE id IN ({marks})", extra)
        gone += extra
    marks = ",".join("?" * len(ids))
    if d.get("orphan"):
        conn.execute(f"UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IN ({marks})", ids)
        conn.execute(f"DELETE FROM messages WHERE session_id IN ({marks})", ids)
    conn.execute(f"DELETE FROM sessions WHERE id IN ({marks})", ids)
    _erase_due(conn, add=gone, at=seq)
    return gone


_HANDLERS["hermes.sessions_deleted"] = _deleted  # apply() calls it with the event's seq


def erase_due(conn: sqlite3.Connection) -> dict[str, int | None]:
    """Hermes id -> the seq of its deletion, for the deleted sessions whose erase has not run yet
    (see ``schema.CURSOR_SQL``; None: not known, the erase takes the whole stream)."""
    row = conn.execute(f"SELECT erase_due FROM {schema.CURSOR_TABLE} WHERE id = 1").fetchone()
    due = json.loads(row[0]) if row is not None else []
    out: dict[str, int | None] = {}
    for entry in due if isinstance(due, list) else []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str):
            out[entry[0]] = entry[1] if type(entry[1]) is int else None
    return out


def _erase_due(conn: sqlite3.Connection, *, add: Iterable[Any] = (), at: int | None = None,
               erased: Iterable[Any] = ()) -> None:
    """Make the (string) ids just deleted due for erase up to ``at``; drop those an erase record
    names, by Hermes id (the facade's record) or by stream (an ``eventlog sessions erase`` of a
    mapped id), or that :func:`settle_erase_due` found nothing left of."""
    due = erase_due(conn)
    done = {x for x in erased if isinstance(x, str)}
    kept = {x: b for x, b in due.items() if x not in done and map_session_id(x) not in done}
    for x in dict.fromkeys(add):
        if isinstance(x, str):
            old = kept.get(x, 0)
            kept[x] = None if at is None or old is None else max(old, at)
    if kept != due:
        conn.execute(f"UPDATE {schema.CURSOR_TABLE} SET erase_due = ? WHERE id = 1",
                     (json.dumps([[x, b] for x, b in kept.items()]),))


def settle_erase_due(conn: sqlite3.Connection, ids: Iterable[str]) -> None:
    """Drop ``ids`` from ``erase_due``: the log holds nothing of theirs up to their deletion (a
    session Hermes made by raw SQL has no events of its own). The log does not record this; a
    rebuild makes them due again and the next erase settles them again, finding the same
    nothing (their deletion's seq bounds what it looks at)."""
    _erase_due(conn, erased=ids)


@rule("hermes.sessions_finalized")
def _finalized(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Orphaned compression continuations (never used, parent compressed away) older than
    ``cutoff`` are ended with reason 'orphaned_compression'."""
    return conn.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = 'orphaned_compression' WHERE api_call_count = 0"
        " AND end_reason IS NULL AND ended_at IS NULL AND started_at < ? AND parent_session_id IS NOT NULL"
        " AND EXISTS (SELECT 1 FROM sessions p WHERE p.id = sessions.parent_session_id"
        " AND p.end_reason = 'compression' AND p.ended_at IS NOT NULL)"
        " AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id)",
        (_v(d, "now"), _v(d, "cutoff"))).rowcount


# ---- import --------------------------------------------------------------------------------

_IMPORT_COLUMNS = ("source", "user_id", "model", "model_config", "system_prompt", "started_at", "ended_at",
                   "end_reason", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                   "reasoning_tokens", "cwd", "git_branch", "git_repo_root", "billing_provider", "billing_base_url",
                   "billing_mode", "estimated_cost_usd", "actual_cost_usd", "cost_status", "cost_source",
                   "pricing_version", "title", "api_call_count", "archived")


@rule("hermes.sessions_imported")
def _imported(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """An exported session restored (Hermes' ``import_sessions``): skipped when the id exists,
    else inserted without parent (attached later) and with its messages."""
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None:
        return 0
    row = d.get("session") or {}
    conn.execute(f"INSERT INTO sessions (id, {', '.join(_IMPORT_COLUMNS)}, message_count, tool_call_count,"
                 f" parent_session_id) VALUES ({', '.join('?' * (len(_IMPORT_COLUMNS) + 1))}, 0, 0, NULL)",
                 (sid, *(_v(row, c) for c in _IMPORT_COLUMNS)))
    n, calls = _insert_messages(conn, sid, d.get("messages") or [])
    _set_counts(conn, sid, n, calls)
    return 1


@rule("hermes.parents_attached")
def _parents(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Parent links set, each only if its parent exists (an imported dangling link is dropped)."""
    n = 0
    for child, parent in d.get("links") or []:
        parent = from_json(parent)
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (parent,)).fetchone() is not None:
            n += conn.execute("UPDATE sessions SET parent_session_id = ? WHERE id = ?",
                              (parent, from_json(child))).rowcount
    return n


@rule("hermes.rows_imported")
def _rows(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Rows of one table copied verbatim from a Hermes ``state.db`` (the switch to eventlog)."""
    table, columns = d.get("table"), d.get("columns") or []
    if table not in IMPORTABLE or not columns or not set(columns) <= IMPORTABLE[table]:
        return 0
    if table == "sqlite_sequence":
        for name, seq in d.get("rows") or []:
            conn.execute("DELETE FROM sqlite_sequence WHERE name = ?", (name,))
            conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, seq))
        return 1
    if table.startswith("telegram_"):
        schema.create_topic_tables(conn)
    sql = f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    rows = d.get("rows") or []
    conn.execute("SAVEPOINT rows_imported")
    try:
        conn.executemany(sql, ([from_json(v) for v in r] for r in rows))
    except sqlite3.IntegrityError:
        # A row whose session is gone (deleted or erased since the import: the replay after an
        # erase meets it) must not take the table's other rows with it: row by row, the rows
        # that no longer fit are left out (found by an outside audit: deleting one session
        # dropped every other session's imported topic binding).
        conn.execute("ROLLBACK TO rows_imported")
        kept = 0
        for r in rows:
            try:
                conn.execute(sql, [from_json(v) for v in r])
                kept += 1
            except sqlite3.IntegrityError:
                continue
        conn.execute("RELEASE rows_imported")
        return kept
    conn.execute("RELEASE rows_imported")
    return len(rows)


IMPORTABLE: dict[str, frozenset[str]] = {
    "sessions": frozenset({"rowid", *schema.SESSION_NAMES}),
    "messages": frozenset(schema.MESSAGE_NAMES),
    "session_model_usage": frozenset(c for c, _ in schema.USAGE_COLUMNS),
    "state_meta": frozenset({"key", "value"}),
    "gateway_routing": frozenset({"scope", "session_key", "entry_json", "updated_at"}),
    "compression_locks": frozenset({"session_id", "holder", "acquired_at", "expires_at"}),
    "async_delegations": frozenset(c for c, _ in schema.DELEGATION_COLUMNS),
    "telegram_dm_topic_mode": frozenset(c for c, _ in schema.TOPIC_MODE_COLUMNS),
    "telegram_dm_topic_bindings": frozenset(c for c, _ in schema.TOPIC_BINDING_COLUMNS),
    "sqlite_sequence": frozenset({"name", "seq"}),
}


@rule("hermes.rows_written")
def _rows_written(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """Row images of a raw SQL write (see :mod:`.raw`)."""
    from eventlog.adapters.hermes.raw import apply_rows_written

    return apply_rows_written(conn, d)


# ---- key/value, gateway routing, locks -----------------------------------------------------

@rule("hermes.meta_set")
def _meta(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return conn.execute("INSERT INTO state_meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET"
                        " value = excluded.value", (_v(d, "key"), _v(d, "value"))).rowcount


_ROUTING_UPSERT = ("INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) VALUES (?, ?, ?, ?)"
                   " ON CONFLICT(scope, session_key) DO UPDATE SET entry_json = excluded.entry_json,"
                   " updated_at = excluded.updated_at")


@rule("hermes.routing_saved")
def _routing_saved(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """One entry upserted."""
    return conn.execute(_ROUTING_UPSERT, (_v(d, "scope"), _v(d, "session_key"), _v(d, "entry_json"),
                                          _v(d, "updated_at"))).rowcount


@rule("hermes.routing_upserted")
def _routing_upserted(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """The part of a large restatement's changed entries that did not fit in its
    ``hermes.routing_restated`` event, upserted ahead of it in the same write."""
    scope, now = _v(d, "scope"), _v(d, "updated_at")
    return sum(conn.execute(_ROUTING_UPSERT, (scope, from_json(k), from_json(v), now)).rowcount
               for k, v in d.get("entries") or [])


@rule("hermes.routing_replaced")
def _routing_replaced(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """The scope's index replaced by the given entries (keys not given disappear). Written by
    releases before ``hermes.routing_restated``; still replayed."""
    scope, now = _v(d, "scope"), _v(d, "updated_at")
    return _routing_rows(conn, scope, [(scope, from_json(k), from_json(v), now) for k, v in d.get("entries") or []])


@rule("hermes.routing_restated")
def _routing_restated(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """The scope's index replaced (keys not in ``order`` disappear), every row inserted again in
    the caller's order; ``entries`` holds only the entries that differ from the stored rows, the
    others keep their stored value. A type of its own, not a field of ``hermes.routing_replaced``:
    a program that predates it ignores it (unknown types are a newer program's), where it would
    have taken the changed entries for the whole index and dropped the others."""
    scope, now = _v(d, "scope"), _v(d, "updated_at")
    given = {from_json(k): from_json(v) for k, v in d.get("entries") or []}
    stored = dict(conn.execute("SELECT session_key, entry_json FROM gateway_routing WHERE scope = ?",
                               (scope,)).fetchall())
    keys = [from_json(k) for k in d.get("order") or []]
    return _routing_rows(conn, scope, [(scope, k, given[k] if k in given else stored[k], now)
                                       for k in keys if k in given or k in stored])


def _routing_rows(conn: sqlite3.Connection, scope: Any, rows: list[tuple[Any, Any, Any, Any]]) -> int:
    n = conn.execute("DELETE FROM gateway_routing WHERE scope = ?", (scope,)).rowcount
    conn.executemany("INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) VALUES (?, ?, ?, ?)",
                     rows)
    return n + len(rows)


@rule("hermes.routing_deleted")
def _routing_deleted(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    scope = _v(d, "scope")
    n = 0
    for key in d.get("keys") or []:
        n += conn.execute("DELETE FROM gateway_routing WHERE scope = ? AND session_key = ?",
                          (scope, from_json(key))).rowcount
    return n


@rule("hermes.compression_lock_acquired")
def _lock_acquired(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> bool:
    """An expired lock is reclaimed; the lock is then taken unless someone else holds it.
    Returns whether ``holder`` holds it afterwards."""
    now, holder = _v(d, "now"), _v(d, "holder")
    conn.execute("DELETE FROM compression_locks WHERE session_id = ? AND expires_at < ?", (sid, now))
    conn.execute("INSERT OR IGNORE INTO compression_locks (session_id, holder, acquired_at, expires_at)"
                 " VALUES (?, ?, ?, ?)", (sid, holder, now, _v(d, "expires_at")))
    row = conn.execute("SELECT holder FROM compression_locks WHERE session_id = ?", (sid,)).fetchone()
    return row is not None and row[0] == holder


@rule("hermes.compression_lock_refreshed")
def _lock_refreshed(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> bool:
    return conn.execute("UPDATE compression_locks SET expires_at = ? WHERE session_id = ? AND holder = ?"
                        " AND expires_at >= ?",
                        (_v(d, "expires_at"), sid, _v(d, "holder"), _v(d, "now"))).rowcount > 0


@rule("hermes.compression_lock_released")
def _lock_released(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return conn.execute("DELETE FROM compression_locks WHERE session_id = ? AND holder = ?",
                        (sid, _v(d, "holder"))).rowcount


# ---- Telegram topic mode -------------------------------------------------------------------

def topic_tables_exist(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'telegram_dm_topic_bindings'"
                        ).fetchone() is not None


@rule("hermes.topic_tables_created")
def _topic_tables(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    schema.create_topic_tables(conn)
    return int(_meta(conn, sid, {"key": "telegram_dm_topic_schema_version", "value": "2"}))


@rule("hermes.topic_mode_enabled")
def _topic_enabled(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    now = _v(d, "now")
    return conn.execute(
        "INSERT INTO telegram_dm_topic_mode (chat_id, user_id, enabled, activated_at, updated_at,"
        " has_topics_enabled, allows_users_to_create_topics, capability_checked_at) VALUES (?, ?, 1, ?, ?, ?, ?, ?)"
        " ON CONFLICT(chat_id) DO UPDATE SET user_id = excluded.user_id, enabled = 1,"
        " updated_at = excluded.updated_at, has_topics_enabled = excluded.has_topics_enabled,"
        " allows_users_to_create_topics = excluded.allows_users_to_create_topics,"
        " capability_checked_at = excluded.capability_checked_at",
        (_v(d, "chat_id"), _v(d, "user_id"), now, now, _v(d, "has_topics_enabled"),
         _v(d, "allows_users_to_create_topics"), now)).rowcount


@rule("hermes.topic_mode_disabled")
def _topic_disabled(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    if not topic_tables_exist(conn):
        return 0
    chat = _v(d, "chat_id")
    n = conn.execute("UPDATE telegram_dm_topic_mode SET enabled = 0, updated_at = ? WHERE chat_id = ?",
                     (_v(d, "now"), chat)).rowcount
    if d.get("clear_bindings"):
        n += conn.execute("DELETE FROM telegram_dm_topic_bindings WHERE chat_id = ?", (chat,)).rowcount
    return n


@rule("hermes.topic_bound")
def _topic_bound(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """One topic thread bound to one session; a session already bound elsewhere is refused."""
    chat, thread = _v(d, "chat_id"), _v(d, "thread_id")
    linked = conn.execute("SELECT chat_id, thread_id FROM telegram_dm_topic_bindings WHERE session_id = ?",
                          (sid,)).fetchone()
    if linked is not None and (str(linked[0]) != chat or str(linked[1]) != thread):
        raise ValueError("session is already linked to another Telegram topic")
    now = _v(d, "now")
    return conn.execute(
        "INSERT INTO telegram_dm_topic_bindings (chat_id, thread_id, user_id, session_key, session_id, managed_mode,"
        " linked_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(chat_id, thread_id) DO UPDATE SET"
        " user_id = excluded.user_id, session_key = excluded.session_key, session_id = excluded.session_id,"
        " managed_mode = excluded.managed_mode, updated_at = excluded.updated_at",
        (chat, thread, _v(d, "user_id"), _v(d, "session_key"), sid, _v(d, "managed_mode"), _v(d, "linked_at", now),
         now)).rowcount


@rule("hermes.topic_unbound")
def _topic_unbound(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """A binding removed; the chat leaves topic mode when that was its last binding. ``moved``:
    the thread is being bound to another session (the next event), recorded in the stream of
    the session it leaves; the binding row goes, nothing else changes."""
    if not topic_tables_exist(conn):
        return 0
    chat = _v(d, "chat_id")
    if d.get("moved"):
        return conn.execute("DELETE FROM telegram_dm_topic_bindings WHERE chat_id = ? AND thread_id = ? AND session_id = ?",
                            (chat, _v(d, "thread_id"), sid)).rowcount
    n = conn.execute("DELETE FROM telegram_dm_topic_bindings WHERE chat_id = ? AND thread_id = ?",
                     (chat, _v(d, "thread_id"))).rowcount
    if n and conn.execute("SELECT 1 FROM telegram_dm_topic_bindings WHERE chat_id = ? LIMIT 1",
                          (chat,)).fetchone() is None:
        conn.execute("UPDATE telegram_dm_topic_mode SET enabled = 0, updated_at = ? WHERE chat_id = ?",
                     (_v(d, "now"), chat))
    return n


# ---- handoff -------------------------------------------------------------------------------

@rule("hermes.handoff_requested")
def _handoff_requested(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    """pending, unless a handoff is already pending or running."""
    return conn.execute(
        "UPDATE sessions SET handoff_state = 'pending', handoff_platform = ?, handoff_error = NULL WHERE id = ?"
        " AND (handoff_state IS NULL OR handoff_state IN ('completed', 'failed'))",
        (_v(d, "platform"), sid)).rowcount


@rule("hermes.handoff_claimed")
def _handoff_claimed(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return conn.execute("UPDATE sessions SET handoff_state = 'running' WHERE id = ? AND handoff_state = 'pending'",
                        (sid,)).rowcount


@rule("hermes.handoff_completed")
def _handoff_completed(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"handoff_state": "completed", "handoff_error": None})


@rule("hermes.handoff_failed")
def _handoff_failed(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> int:
    return _set_columns(conn, sid, {"handoff_state": "failed", "handoff_error": _v(d, "error")})


@rule("log.erased")
def _erased(conn: sqlite3.Connection, sid: Any, d: dict[str, Any]) -> None:
    """eventlog's erase record: the erased sessions' events are stubs (never applied again), so
    their erase is no longer due; the AUTOINCREMENT counters it carries keep a rebuild from
    reusing a deleted row's id."""
    sessions = d.get("sessions")
    if isinstance(sessions, list):
        _erase_due(conn, erased=sessions)
    counters = d.get("sqlite_sequence")
    for name, seq in (counters.items() if isinstance(counters, dict) else ()):
        if isinstance(name, str) and isinstance(seq, int) and not isinstance(seq, bool):
            conn.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (seq, name))
            if conn.execute("SELECT changes()").fetchone()[0] == 0:
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, seq))
