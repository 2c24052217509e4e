"""A long scan of the log does not keep the pages it read mapped (RSS stays bounded)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from eventlog.log import EventLog
from eventlog.log import lmdb as log_module
from eventlog.sessions.events import make_event

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def scan_growth(log: EventLog) -> int:
    """Peak growth of file-backed RSS (KB) while reading every event."""
    log.release_pages()
    base = peak = rss_file_kb()
    for i, _env in enumerate(log.read(1)):
        if i % 16 == 0:
            peak = max(peak, rss_file_kb())
    return peak - base


def test_scans_hand_log_pages_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    for b in range(20):  # random hex (zstd halves it): 400 events of ~100 KB stored, ~40 MB of log
        log.append([make_event("message.appended", f"s{b}", {"role": "user", "content": os.urandom(100_000).hex()})
                    for i in range(20)])
    monkeypatch.setattr(log_module, "RELEASE_EVERY_BYTES", 1 << 60)
    kept = scan_growth(log)
    monkeypatch.setattr(log_module, "RELEASE_EVERY_BYTES", 2 << 20)
    released = scan_growth(log)
    log.close()
    assert kept > 30_000, f"control: a scan without release should map the whole ~40 MB log, grew {kept} KB"
    assert released < 12_000, f"a releasing scan kept {released} KB of log pages mapped"
