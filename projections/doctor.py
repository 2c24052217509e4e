"""``eventlog doctor``: check the log, the projections, the lease, the disk and the file permissions.

Without ``fix`` nothing is changed: the projections are inspected through read-only
connections *before* anything could heal them, so the report shows what was found. With
``fix`` every projection problem is repaired by rebuilding (never by writing the log), and
permissions are tightened; the report is then taken again. ``deep`` adds :mod:`projections.deep`:
the projections compared row by row with the fold of the log (``fix`` then rebuilds them when
they differ).

A damaged log is reported with its first bad seq and recorded for every process
(:mod:`eventlog.log.damage`: appends refuse, reads say they stop before it); a log that
verifies again (restored from a backup) has its record removed.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Callable

from eventlog.errors import process_state
from eventlog.log import Log, VerifyResult
from eventlog.log import damage as log_damage
from eventlog.profiles import DIR_MODE as PRIVATE_DIR
from eventlog.profiles import FILE_MODE as PRIVATE_FILE
from eventlog.profiles import chown_owner, hand_over, user_name
from projections import files, space
from projections.health import HEALTHY
from projections.projector import Projector

Progress = Callable[[int, int], None]


def permission_problems(profile_dir: Path) -> list[str]:
    """Paths under the profile whose mode is not 0700 (dirs) / 0600 (files) -- more open, or
    keeping the owner out -- or that belong to another user than the profile directory's owner
    (left by a command run as root, or a copy made as another user)."""
    return [text for _p, text, _mode in _permission_findings(profile_dir)]


def _permission_findings(profile_dir: Path) -> list[tuple[Path, str, int | None]]:
    """``(path, problem, the mode that repairs it)``; None: ``chmod`` cannot (another user's)."""
    paths = [profile_dir]
    for root, dirs, names in os.walk(profile_dir):
        # A directory standing where a pointer belongs, or one set aside, is not eventlog's:
        # it is reported as such, its contents are not judged.
        dirs[:] = [d for d in dirs if not (root == str(profile_dir) and _stray(d))]
        paths.extend(Path(root) / n for n in [*dirs, *names])
    try:
        owner = os.stat(profile_dir).st_uid
    except OSError:
        return []
    found: list[tuple[Path, str, int | None]] = []
    for p in paths:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        want = PRIVATE_DIR if stat.S_ISDIR(st.st_mode) else PRIVATE_FILE
        if st.st_uid != owner:
            found.append((p, f"{p} belongs to {user_name(st.st_uid)}, not to the profile's owner, {user_name(owner)}", None))
        elif stat.S_IMODE(st.st_mode) != want:
            found.append((p, f"{p} is {oct(stat.S_IMODE(st.st_mode))}, expected {oct(want)}", want))
    return found


def ownership_hint(profile_dir: Path) -> str:
    """How to give the profile's files back to its owner: ``chown -R`` (nothing is deleted)."""
    import shlex

    st = os.stat(profile_dir)
    return (f"give them back to the profile's owner: sudo chown -R {chown_owner(st.st_uid, st.st_gid)} "
            f"{shlex.quote(str(profile_dir))} "
            "(delete nothing: they may hold the data)")


def _stray(name: str) -> bool:
    return name in ("state.db", "fts.db") or ".db.displaced." in name


def lease_state(projector: Projector, state_seq: int | None, log_head: int) -> dict[str, Any]:
    """The projector lease: free, or held by another process (``holder`` pid and its
    ``holder_state``). Not ok when a stopped holder keeps the projections behind the log: every
    one-shot reader then answers stale."""
    path = projector.lease.path
    if projector.lease.acquire(0):
        projector.lease.release()
        return {"ok": True, "path": str(path), "held_by_other": False, "holder": None, "holder_state": None,
                "detail": "free"}
    holder = projector.lease_holder()
    state = process_state(holder)
    behind = state_seq is not None and state_seq < log_head
    stopped = state == "stopped"
    out = {"ok": not (behind and stopped), "path": str(path), "held_by_other": True, "holder": holder,
           "holder_state": state}
    out["detail"] = f"held by process {holder} ({state})"
    if not out["ok"]:
        out["detail"] = (f"process {holder} ({state}) holds the projector lease and is stopped: reads are stale "
                         f"(projections at seq {state_seq} of {log_head})")
        out["hint"] = (f"resume it (kill -CONT {holder}) or end it (kill {holder}); --fix cannot help while it "
                       "holds the lease")
    return out


def disk_state(profile_dir: Path) -> dict[str, Any]:
    """Room to write in the profile: ``{"ok", "free_bytes", "read_only", "detail"}``."""
    why = space.cannot_write(profile_dir)
    return {"ok": why is None, "free_bytes": space.free_bytes(profile_dir), "read_only": space.read_only(profile_dir),
            "detail": why or ""}


def displaced(profile_dir: Path) -> list[str]:
    """Directories and files a repair set aside (they stood where a projection pointer belongs)."""
    try:
        return sorted(n for n in os.listdir(profile_dir) if ".db.displaced." in n)
    except OSError:
        return []


def unerased_detail(res: VerifyResult) -> str:
    """What ``res.unerased`` means, for doctor and ``log verify``."""
    return (f"{res.unerased} event(s) that erase records name still hold their content (a copy or import "
            "by a release before 2026-12-07 brought the records without erasing what they name)")


def unerased_hint(res: VerifyResult) -> str:
    """The remedy: erase those sessions again (what an erase leaves is erased then)."""
    if not res.unerased_sessions:
        return "erase those events again (Log.erase with their seqs: they belong to no session)"
    shown = " ".join(res.unerased_sessions[:5]) + (" ..." if len(res.unerased_sessions) > 5 else "")
    return f"erase their sessions again: `eventlog sessions erase ID --reason ...` for {shown}"


def examine(profile_dir: Path, log: Log, profile: str, *, deep: bool = False,
            progress: Progress | None = None) -> dict[str, Any]:
    """The doctor's report; changes nothing (but records or clears the log's damage marker)."""
    known = log_damage.recorded(log)
    if known is not None and known.file is not None and log_damage.still_damaged(log, known):
        # found by a read that killed the process (a damaged page of data.mdb), and the file is
        # the same: verifying again would kill this one
        head_seq, head_hash = log.head()
        res = VerifyResult(False, max(known.seq - 1, 0), head_seq, head_hash, known.seq, known.reason, 0)
    else:
        res = log.verify()
    if res.ok:
        log_damage.clear(log)
    elif res.first_bad_seq is not None:
        log_damage.record(log, log_damage.Damage(res.first_bad_seq, res.reason or "fails the chain check"))
    with Projector(profile_dir, log, profile) as projector:
        health = projector.health(full=True)
        lease = lease_state(projector, health["state"].get("last_seq"), res.head_seq)
        skipped = projector.skipped_types()
        deep_report = None
        if deep:
            # A reader rebuilds a state.db it cannot use: compare only one that is sound as found.
            status = health["state"]["status"]
            deep_report = (_deep(projector, progress) if status in HEALTHY else
                           {"ok": False, "first_difference": None, "compared_seq": None, "tables": {},
                            "detail": f"not compared: state.db is {status} (run `eventlog doctor --fix`)"})
    perms = permission_problems(profile_dir)
    disk = disk_state(profile_dir)
    parts = {kind: _part(health[kind], never_built=not files.generations(profile_dir, kind)) for kind in ("state", "fts")}
    report: dict[str, Any] = {
        "log": {"ok": res.ok, "head_seq": res.head_seq, "head_hash": res.head_hash, "events": res.events,
                "first_bad_seq": res.first_bad_seq, "reason": res.reason, "erased": res.erased,
                "unerased": res.unerased, "unerased_sessions": res.unerased_sessions},
        "state": {**parts["state"], "skipped_types": skipped},
        "fts": {**parts["fts"], "degraded": bool(health["fts"].get("degraded"))},
        "lease": lease,
        "disk": disk,
        "permissions": {"ok": not perms, "problems": perms, "displaced": displaced(profile_dir)},
    }
    if any(" belongs to " in p for p in perms):
        report["permissions"]["hint"] = ownership_hint(profile_dir)
    if not res.ok and res.first_bad_seq is not None:
        if log_damage.marker_path(log) is not None:
            report["log"]["detail"] = (f"damaged at seq {res.first_bad_seq}: the projections stop before it and "
                                       "appends are refused")
            report["log"]["hint"] = log_damage.REPAIR_HINT
        else:  # a log on a server keeps no damage marker: it said "appends are refused" and took them
            report["log"]["detail"] = (f"damaged at seq {res.first_bad_seq}: projections stop before it where "
                                       "they have not applied it yet; appends are not refused (a log on a server "
                                       "keeps no damage marker)")
            report["log"]["hint"] = log_damage.SERVER_REPAIR_HINT
    pending_erase = getattr(log, "erase_pending", None)
    erase_seq = int(pending_erase()) if pending_erase is not None and res.ok else 0
    report["log"]["erase_pending"] = erase_seq or None
    if erase_seq:  # the erase is committed, but its process stopped before the files were clean
        report["log"]["detail"] = (f"the erase at seq {erase_seq} did not finish: files of the profile may "
                                   "still hold what it erased")
        report["log"]["hint"] = "run `eventlog compact` (or the erase again) to finish it"
    elif res.ok and res.unerased:
        report["log"]["detail"] = unerased_detail(res)
        report["log"]["hint"] = unerased_hint(res)
    leftovers = _compaction_leftovers(profile_dir / "log")
    if leftovers:
        report["log"]["leftovers"] = leftovers
    if deep_report is not None:
        report["deep"] = deep_report
    report["ok"] = bool(res.ok and not erase_seq and not res.unerased
                        and report["state"]["ok"] and report["fts"]["ok"] and not perms and disk["ok"]
                        and lease["ok"]
                        and (deep_report is None or deep_report["ok"]))
    return report


def _compaction_leftovers(log_dir: Path) -> list[str]:
    """The ``log/<generation>.tmp`` folders a compaction stopped before its end left (a full
    copy of the log each, until the next compaction removes them; one under way has one too)."""
    try:
        return sorted(f"log/{n}" for n in os.listdir(log_dir) if n.endswith(".tmp") and (log_dir / n).is_dir())
    except OSError:
        return []


def _deep(projector: Projector, progress: Progress | None) -> dict[str, Any]:
    from projections.deep import deep_check

    reader = projector.reader()
    try:
        return deep_check(projector.log, reader, progress)
    finally:
        reader.close()


def _part(h: dict[str, Any], *, never_built: bool = False) -> dict[str, Any]:
    """A projection's part of the report. One that was never built (no pointer, no generation
    file: a new or just imported profile) is missing but not a problem: the first read builds it
    from the log (an outside audit found `init` then `doctor` exiting 1)."""
    unbuilt = never_built and h["status"] == "missing" and h.get("detail") == "no projection file"
    return {"status": h["status"], "ok": h["status"] in HEALTHY or unbuilt,
            "detail": "not built yet: the first read builds it from the log" if unbuilt else h.get("detail"),
            "last_seq": h.get("last_seq"), "log_head": h.get("log_head")}


def repair(profile_dir: Path, log: Log, profile: str, *, deep: bool = False,
           progress: Progress | None = None) -> list[str]:
    """Rebuild what is broken (``deep``: also what differs from the log), set file modes, and
    (run as root) give root's files back to the profile's owner. Never writes the log. Returns
    what it did."""
    done = []
    with Projector(profile_dir, log, profile) as projector:
        before = projector.health(full=True)
        aside = set(displaced(profile_dir))
        projector.heal(full=True)
        for kind in ("state", "fts"):
            if before[kind]["status"] not in HEALTHY:
                done.append(f"rebuilt {kind} ({before[kind]['status']})")
        done += [f"set aside {name} (it stood where a projection pointer belongs)"
                 for name in sorted(set(displaced(profile_dir)) - aside)]
        if deep:
            found = _deep(projector, progress)
            if not found["ok"] and found["first_difference"] is not None:
                projector.rebuild("all")
                done.append(f"rebuilt state and fts ({found['detail']})")
    for _ in range(2):  # a file given back by the first pass may have a mode to set too: the second sees it
        given_back = False
        for p, _problem, mode in _permission_findings(profile_dir):
            if mode is None:
                # another user's: root (doctor --fix run with sudo) gives root's own files back to the
                # profile's owner; otherwise only the hint can (ownership_hint)
                hand_over(p)
                try:
                    if os.lstat(p).st_uid == os.stat(p.parent).st_uid:
                        done.append(f"chown {p}")
                        given_back = True
                except OSError:
                    pass
                continue
            try:
                os.chmod(p, mode)
            except OSError:
                continue  # still reported by the check that follows
            done.append(f"chmod {p}")
        if not given_back:
            break
    return done
