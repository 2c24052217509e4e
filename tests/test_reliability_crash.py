"""Crash campaign: an agent workload through SessionStore, SIGKILLed at random moments.

After every kill: each acknowledged write is in the log at the seq it was acknowledged with
(and with its event type and session), seqs are gapless, verify passes, and — once the
projections exist — the reopened store answers exactly as a fresh rebuild of the same log in
another home and as the reference fold. With projections the child also calls ``sync()`` and
rebuilds in its loop, and some kills are aimed at those moments.
"""
from __future__ import annotations

import random
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from campaign import (
    PROFILE,
    Child,
    check_log,
    log_dir,
    parse_acks,
    projection_problems,
    size,
)
from campaign.summary import note, record

pytest_plugins = ["campaign.summary"]


def kill_at_random(child: Child, rng: random.Random) -> str:
    """Kill ``child`` at a random moment; returns where the kill was aimed."""
    roll = rng.random()
    if roll < 0.15:
        time.sleep(rng.uniform(0.0, 0.35))  # while importing, opening, catching up
        child.kill()
        return "startup"
    ready = child.wait_line("READY", timeout=60)
    assert ready is not None, f"child never became ready: {child.stderr[-2000:]}"
    if roll < 0.40:
        at = child.wait_line("BEGIN", timeout=10, start=ready)
        if at is not None:
            time.sleep(rng.uniform(0.0, 0.01))
            child.kill()
            return "projector"
    time.sleep(rng.uniform(0.02, 0.5))
    child.kill()
    return "running"


def landed_in(lines: list[str]) -> str | None:
    """The projector work a kill interrupted (``sync``/``rebuild``), if any."""
    begun = None
    for line in lines:
        if line.startswith("BEGIN "):
            begun = line.split()[1]
        elif line.startswith("END "):
            begun = None
    return begun


def crash_campaign(tmp_path: Path, kills: int, seed: int, case: str) -> None:
    model = "projection"
    rng = random.Random(seed)
    per_home = 10
    failures: list[str] = []
    passed = lost_total = acked_total = 0
    aimed: Counter[str] = Counter()
    interrupted: Counter[str] = Counter()
    warned: Counter[str] = Counter()  # what killed children printed on stderr (library warnings)
    acked: list[tuple[str, str, int | None]] = []
    home = tmp_path
    for k in range(kills):
        if k % per_home == 0:
            home = tmp_path / f"home{k // per_home}"
            acked = []
        child = Child("agent_child", home, PROFILE, rng.randrange(2**32), model)
        aimed[kill_at_random(child, rng)] += 1
        code = child.proc.returncode
        problems: list[str] = []
        if code != -signal.SIGKILL:
            problems.append(f"child ended by itself with status {code}: {child.stderr[-2000:]}")
        for line in child.stderr.splitlines():
            if line.strip():
                warned[line.strip()[:160]] += 1
        stage = landed_in(child.lines)
        if stage:
            interrupted[stage] += 1
        new = parse_acks(child.lines)
        acked += new
        acked_total += len(new)
        if (log_dir(home) / "data.mdb").exists():
            found, lost, envs = check_log(log_dir(home), acked)
            problems += found
            lost_total += lost
            if not found:
                scratch = tmp_path / "fresh"
                problems += projection_problems(home, scratch, envs)
                shutil.rmtree(scratch, ignore_errors=True)
        elif acked:
            problems.append("the log vanished")
        if problems:
            failures.append(f"kill {k} ({model}): " + "; ".join(problems))
        else:
            passed += 1
    record(case, runs=kills, passed=passed, lost=lost_total)
    note(f"{case}: seed {seed}, {kills} kills ({dict(aimed)}), {acked_total} acknowledged writes, read model {model}"
         + f", kills inside projector work: {dict(interrupted)}"
         + (f"; children warned on stderr: {warned.most_common(3)}" if warned else ""))
    assert not failures, "\n".join(failures[:10])
    assert acked_total > kills, "the kills should land while the child is writing"


def test_crash_campaign_default(tmp_path: Path) -> None:
    crash_campaign(tmp_path, size(30, 30, "EVENTLOG_KILLS"), seed=20240601, case="crash (SIGKILL agent)")


@pytest.mark.campaign
def test_crash_campaign_full(tmp_path: Path) -> None:
    crash_campaign(tmp_path, max(size(500, 500, "EVENTLOG_KILLS"), 1), seed=int(time.time()),
                   case="crash campaign (SIGKILL agent)")
