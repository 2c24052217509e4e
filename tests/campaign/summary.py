"""The campaign's summary table, printed when the pytest session finishes.

Test modules register this plugin with ``pytest_plugins = ["campaign.summary"]`` and report
each case with :func:`record` (and figures with :func:`note`) before asserting, so that a
failing case still shows its counts. The table is printed at the end of campaign runs
(``EVENTLOG_CAMPAIGN=1``), and of runs with ``-s`` or ``-v``; with ``EVENTLOG_SUMMARY=path``
it is also written there as JSON.

PYTEST_DONT_REWRITE (test modules import it before pytest sees their ``pytest_plugins``).
"""
from __future__ import annotations

import json
import os
from typing import Any

from campaign import CAMPAIGN

COLUMNS = ("case", "runs", "passed", "lost acknowledged writes", "undetected corruptions", "hung", "tracebacks")
ROWS: dict[str, dict[str, Any]] = {}
NOTES: list[str] = []


def record(case: str, *, runs: int, passed: int, lost: int = 0, undetected: int = 0, hung: int = 0,
           tracebacks: int = 0) -> None:
    """Add one run of ``case`` to the table (counts of several calls add up). ``hung``: commands
    that did not answer in time; ``tracebacks``: answers that showed a Python traceback."""
    row = ROWS.setdefault(case, {"runs": 0, "passed": 0, "lost": 0, "undetected": 0, "hung": 0, "tracebacks": 0})
    row["runs"] += runs
    row["passed"] += passed
    row["lost"] += lost
    row["undetected"] += undetected
    row["hung"] += hung
    row["tracebacks"] += tracebacks


def note(text: str) -> None:
    """A figure printed under the table (latencies, kills that landed mid-rebuild, ...)."""
    NOTES.append(text)


def table() -> list[str]:
    rows = [(case, *(str(r.get(k, 0)) for k in ("runs", "passed", "lost", "undetected", "hung", "tracebacks")))
            for case, r in ROWS.items()]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    out = [line(COLUMNS), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    total = [sum(int(r[i]) for r in rows) for i in range(1, len(COLUMNS))]
    out.append(line(["-" * w for w in widths]))
    out.append(line(["total", *map(str, total)]))
    return out


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Write the table as JSON when ``EVENTLOG_SUMMARY`` names a file."""
    if (ROWS or NOTES) and os.environ.get("EVENTLOG_SUMMARY"):
        with open(os.environ["EVENTLOG_SUMMARY"], "w") as f:
            json.dump({"rows": ROWS, "notes": NOTES}, f, indent=2, ensure_ascii=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """Print the table. The terminal reporter calls this from its own session-finish hook, after
    the failures are shown, so the table is the last thing before the one-line totals."""
    if not ROWS and not NOTES:
        return
    if not (CAMPAIGN or config.getoption("capture", "fd") == "no" or config.getoption("verbose", 0) > 0):
        return
    terminalreporter.write_sep("=", "reliability campaign summary")
    if ROWS:
        for text in table():
            terminalreporter.write_line(text)
    for text in NOTES:
        terminalreporter.write_line(text)
