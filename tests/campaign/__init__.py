"""The reliability harness (issue 6): children that drive real workloads, the checks run after
each fault, and the sizes of the default run and of the campaign.

Sizes: the default test run uses the small figures; ``EVENTLOG_CAMPAIGN=1`` (set by
``python3 run campaign``) switches to the campaign figures. ``EVENTLOG_KILLS`` overrides the
number of kills of the crash campaign in both.

This module is imported by the child processes too, so it imports neither pytest nor
hypothesis.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

TESTS_DIR = Path(__file__).resolve().parent.parent
CAMPAIGN = bool(os.environ.get("EVENTLOG_CAMPAIGN"))
PROFILE = "agent"
SEARCH_WORDS = ("gateway", "rollback", "latency", "webhook", "terminal", "kernel")


def size(default: int, campaign: int, env: str | None = None) -> int:
    """The size of a case: ``env`` (an environment variable) if set, else the campaign or default figure."""
    if env and os.environ.get(env):
        return int(os.environ[env])
    return campaign if CAMPAIGN else default


# ------------------------------------------------------------------ child processes

def child_env() -> dict[str, str]:
    """Environment of a child: ``campaign`` importable, output unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Child:
    """A child process running ``python -m campaign.<module> args``, its stdout collected by a thread.

    Lines are kept as they arrive (a line cut short by a kill has no newline and is dropped),
    so the parent can wait for markers and never blocks the child on a full pipe.
    """

    def __init__(self, module: str, *args: object, stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"campaign.{module}", *map(str, args)],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
        )
        self.lines: list[str] = []
        self.err = b""
        self._cv = threading.Condition()
        self._out = threading.Thread(target=self._pump, daemon=True)
        self._err = threading.Thread(target=self._pump_err, daemon=True)
        self._out.start()
        self._err.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break
            with self._cv:
                self.lines.append(raw[:-1].decode())
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def wait_line(self, prefix: str, timeout: float, start: int = 0) -> int | None:
        """Index of the first line at or after ``start`` that starts with ``prefix`` (None on timeout or exit)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for i in range(start, len(self.lines)):
                    if self.lines[i].startswith(prefix):
                        return i
                start = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._out.is_alive()):
                    return None
                self._cv.wait(min(left, 0.05))

    def send(self, line: str) -> None:
        """Write one command line to the child's stdin (``stdin=True``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()

    def finish(self, timeout: float | None = None) -> int:
        """Wait for the process and its output; returns the exit code (negative: killed by that signal)."""
        code = self.proc.wait(timeout)
        self._out.join(10)
        self._err.join(10)
        return code

    @property
    def stderr(self) -> str:
        return self.err.decode(errors="replace")


def parse_acks(lines: Iterable[str]) -> list[tuple[str, str, int | None]]:
    """``ACK <event type> <session> <seq|->`` lines as ``(type, session, seq or None)``."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ACK":
            out.append((parts[1], parts[2], None if parts[3] == "-" else int(parts[3])))
    return out


# ------------------------------------------------------------------ checks of the log

def log_dir(home: Path, profile: str = PROFILE) -> Path:
    return home / "profiles" / profile / "log"


def check_log(path: Path, acked: list[tuple[str, str, int | None]]) -> tuple[list[str], int, list[dict[str, Any]]]:
    """Verify the closed log at ``path`` against the acknowledged writes.

    Returns ``(problems, lost, envelopes)``: what is wrong (empty when all is well), how many
    acknowledged writes are missing or changed, and the envelopes read.
    """
    from eventlog.log import EventLog

    problems: list[str] = []
    with EventLog.open(path) as lg:
        res = lg.verify()
        if not res.ok:
            problems.append(f"verify failed at seq {res.first_bad_seq}: {res.reason}")
            return problems, len(acked), []
        envs = list(lg.read())
    seqs = [e["seq"] for e in envs]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append("seqs are not gapless from 1")
    by_seq = {e["seq"]: e for e in envs}
    created = {}
    for e in envs:
        if e["type"] == "session.created":
            created[e["session"]] = created.get(e["session"], 0) + 1
    lost = 0
    for etype, sid, seq in acked:
        if seq is None:
            ok = etype == "session.created" and created.get(sid) == 1
        else:
            e = by_seq.get(seq)
            ok = e is not None and e["type"] == etype and e["session"] == sid
        if not ok:
            lost += 1
            if lost <= 5:
                problems.append(f"acknowledged {etype} of {sid} at seq {seq} is not in the log as acknowledged")
    return problems, lost, envs


# ------------------------------------------------------------------ answers of a read model

def search_ids(result: Any) -> list[int]:
    """The message ids of a search answer (the fold's list of messages, or the projection's results)."""
    items = result
    if isinstance(result, dict):
        items = result.get("results", [])
    elif hasattr(result, "results"):
        items = result.results
    ids = []
    for item in items:
        mid = item.get("message_id", item.get("id")) if isinstance(item, dict) else getattr(item, "message_id", None)
        ids.append(int(mid))
    return sorted(ids)


def answers(q: Any) -> dict[str, Any]:
    """What a read model answers (a store or a Fold), restricted to the keys docs/EVENTS.md defines,
    so that the fold, a reopened projection and a fresh rebuild can be compared exactly."""
    from eventlog.sessions.fold import MESSAGE_KEYS, REACTION_KEYS, SESSION_KEYS, USAGE_KEYS

    def pick(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        return {k: d.get(k, "<missing>") for k in keys}

    everything = q.list_sessions(archived=None, pinned=None, hidden=None, limit=None)
    ids = [s["id"] for s in everything]
    stats = q.stats()
    return {
        "sessions": [pick(s, SESSION_KEYS) for s in everything],
        "listing": [s["id"] for s in q.list_sessions()],
        "roots": [s["id"] for s in q.list_sessions(children=False, archived=None, limit=None)],
        "messages": {sid: [pick(m, MESSAGE_KEYS) for m in q.get_messages(sid, include_inactive=True)] for sid in ids},
        "usage": {sid: [pick(u, USAGE_KEYS) for u in q.get_usage(sid)] for sid in ids},
        "reactions": {mid: [pick(r, REACTION_KEYS) for r in q.get_reactions(mid)]
                      for sid in ids for mid in (m["id"] for m in q.get_messages(sid, include_inactive=True))},
        "stats": {k: stats.get(k, "<missing>") for k in ("sessions", "messages", "by_source", "input_tokens",
                                                          "output_tokens", "cache_read_tokens", "cache_write_tokens",
                                                          "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd")},
        "search": {w: search_ids(q.search(w, limit=None)) for w in SEARCH_WORDS},
    }


def fold_answers(envs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    from eventlog.sessions.fold import Fold

    fold = Fold()
    fold.apply_all(envs)
    return answers(fold)


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two answers first differ, as a short readable path (None when equal)."""
    if type(a) is not type(b):
        return f"{path or '<root>'}: {a!r:.120} != {b!r:.120}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: present on one side only"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path or '<root>'}: {a!r:.120} != {b!r:.120}"


def copy_log(home: Path, into: Path, profile: str = PROFILE) -> Path:
    """Copy a closed profile's log (no process may have it open) into a fresh home; returns that home."""
    dst = log_dir(into, profile)
    dst.mkdir(parents=True, mode=0o700)
    shutil.copy2(log_dir(home, profile) / "data.mdb", dst / "data.mdb")
    return into


def projection_problems(home: Path, scratch: Path, envs: list[dict[str, Any]], profile: str = PROFILE) -> list[str]:
    """Reopen the profile's projection, rebuild the same log from scratch in another home, and
    compare both with the fold over the log. Returns the differences found."""
    from eventlog.sessions.store import SessionStore

    expected = fold_answers(envs)
    problems = []
    with SessionStore.open(home, profile, read_model="projection") as store:
        store.sync()
        reopened = answers(store)
    fresh_home = copy_log(home, scratch, profile)
    with SessionStore.open(fresh_home, profile, read_model="projection") as store:
        store.sync()
        rebuilt = answers(store)
    for name, got in (("reopened projection", reopened), ("fresh rebuild", rebuilt)):
        diff = first_difference(expected, got)
        if diff:
            problems.append(f"{name} differs from the fold: {diff}")
    return problems


def rebuild(store: Any) -> bool:
    """Rebuild the store's projections from scratch if the projection code offers a way; returns
    whether it did. Looks for ``rebuild()`` on the store, then on its read model and projector."""
    for owner in (store, getattr(store, "_reads", None), getattr(store, "_projector", None)):
        fn = getattr(owner, "rebuild", None)
        if callable(fn):
            fn()
            return True
    return False
