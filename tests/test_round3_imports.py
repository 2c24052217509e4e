"""Imports, third-round outside audit (helper-64): what the earlier audit of the imports left --
a verbatim JSONL import that another process appends into, Hermes JSON columns that do not
decode, a sessions row whose huge column is a BLOB, and a session another process creates with
a Hermes id while the import runs."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from eventlog.errors import ConflictError
from eventlog.log.lmdb import EventLog
from sqlite_export.jsonl import CHUNK, export_jsonl, import_jsonl

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(Path(__file__).parent))

APPENDER = """
import sys
from eventlog.log.lmdb import EventLog
with EventLog.open(sys.argv[1]) as lg:
    lg.append([{"type": "session.created", "session": "elsewhere", "data": {}}])
"""


def _another_process_appends(target: Path) -> None:
    subprocess.run([sys.executable, "-c", APPENDER, str(target)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_verbatim_import_is_all_or_nothing_against_another_appending_process(tmp_path: Path) -> None:
    """A whole-log export into an empty profile went in chunks of sealed events, each its own
    transaction: another process appending after the first chunk left the file's first 2000
    events in the log with the other process's event after them, and the import refused to go
    on (a re-run is refused too). The file now goes in as one transaction under the log's
    writer lock: the other process's event comes before all of it (the import is refused,
    nothing of the file written) or after all of it."""
    with EventLog.open(tmp_path / "src", durability="nosync") as src:
        src.append([{"type": "session.created", "session": "s", "data": {}}])
        src.append([{"type": "message.appended", "session": "s", "data": {"role": "user", "content": f"m{i}"}}
                    for i in range(CHUNK + 10)])
        out = io.BytesIO()
        export_jsonl(src, out)
        head = src.head()
    lines = out.getvalue().splitlines()
    target = tmp_path / "dst"
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        if not seen:  # the first report of progress: the other process appends now
            _another_process_appends(target)
        seen.append(done)

    with EventLog.open(target, durability="nosync") as dst:
        try:
            res = import_jsonl(dst, lines, progress=progress, onto_other_history=False)
        except ConflictError:
            assert dst.head()[0] == 1  # refused: the other process's event alone
        else:
            assert res.mode == "verbatim" and res.imported == len(lines)
            assert dst.get(len(lines))["hash"] == head[1]  # the whole file first, then the other's event
            assert dst.head()[0] == len(lines) + 1
        assert dst.verify().ok
        assert [e["session"] for e in dst.read(1)].count("elsewhere") == 1

