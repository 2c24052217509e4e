"""``eventlog doctor``: check the log, the projections, the lease and the file permissions.

Without ``fix`` nothing is changed: the projections are inspected through read-only
connections *before* anything could heal them, so the report shows what was found. With
``fix`` every projection problem is repaired by rebuilding (never by writing the log), and
permissions are tightened; the report is then taken again.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from eventlog.log import Log
from eventlog.profiles import DIR_MODE as PRIVATE_DIR
from eventlog.profiles import FILE_MODE as PRIVATE_FILE
from projections.health import HEALTHY
from projections.projector import Projector


def permission_problems(profile_dir: Path) -> list[str]:
    """Paths under the profile that are more open than 0700 (dirs) / 0600 (files)."""
    paths = [profile_dir]
    for root, dirs, names in os.walk(profile_dir):
        paths.extend(Path(root) / n for n in [*dirs, *names])
    problems = []
    for p in paths:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        want = PRIVATE_DIR if stat.S_ISDIR(st.st_mode) else PRIVATE_FILE
        if stat.S_IMODE(st.st_mode) & ~want:
            problems.append(f"{p} is {oct(stat.S_IMODE(st.st_mode))}, expected {oct(want)}")
    return problems


def lease_state(projector: Projector) -> dict[str, Any]:
    path = projector.lease.path
    if projector.lease.acquire(0):
        projector.lease.release()
        return {"ok": True, "path": str(path), "held_by_other": False}
    return {"ok": True, "path": str(path), "held_by_other": True}


def examine(profile_dir: Path, log: Log, profile: str) -> dict[str, Any]:
    """The doctor's report; changes nothing."""
    res = log.verify()
    with Projector(profile_dir, log, profile) as projector:
        health = projector.health(full=True)
        lease = lease_state(projector)
        skipped = projector.skipped_types()
    perms = permission_problems(profile_dir)
    report: dict[str, Any] = {
        "log": {"ok": res.ok, "head_seq": res.head_seq, "head_hash": res.head_hash, "events": res.events,
                "first_bad_seq": res.first_bad_seq, "reason": res.reason},
        "state": {**_part(health["state"]), "skipped_types": skipped},
        "fts": {**_part(health["fts"]), "degraded": bool(health["fts"].get("degraded"))},
        "lease": lease,
        "permissions": {"ok": not perms, "problems": perms},
    }
    report["ok"] = bool(res.ok and report["state"]["ok"] and report["fts"]["ok"] and not perms)
    return report


def _part(h: dict[str, Any]) -> dict[str, Any]:
    return {"status": h["status"], "ok": h["status"] in HEALTHY, "detail": h.get("detail"),
            "last_seq": h.get("last_seq"), "log_head": h.get("log_head")}


def repair(profile_dir: Path, log: Log, profile: str) -> list[str]:
    """Rebuild what is broken and tighten permissions. Never writes the log. Returns what it did."""
    done = []
    with Projector(profile_dir, log, profile) as projector:
        before = projector.health(full=True)
        projector.heal(full=True)
        for kind in ("state", "fts"):
            if before[kind]["status"] not in HEALTHY:
                done.append(f"rebuilt {kind} ({before[kind]['status']})")
    for problem in permission_problems(profile_dir):
        p = Path(problem.split(" is ")[0])
        os.chmod(p, PRIVATE_DIR if p.is_dir() else PRIVATE_FILE)
        done.append(f"chmod {p}")
    return done
