"""state.db deleted or overwritten by a user between the steps of a catch-up that an adapter's
read or write starts (outside audit, helper-67): the catch-up heals it, the call answers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from eventlog.adapters.langgraph import EventlogSaver
from projections.catchup import CatchUp


def _checkpoint(saver: EventlogSaver, n: int) -> dict[str, Any]:
    c = empty_checkpoint()
    c["channel_values"] = {"n": n}
    c["channel_versions"] = {"n": saver.get_next_version(None, None)}
    return dict(c)


def _once_after(step: str, monkeypatch: pytest.MonkeyPatch, fault: Callable[[Path], None], profile: Path) -> list[str]:
    """``fault`` strikes state.db once, right after the catch-up's ``step`` (what a user's ``rm``
    or an overwrite does at that moment)."""
    struck: list[str] = []
    original = getattr(CatchUp, step)

    def then_fault(self: CatchUp) -> Any:
        out = original(self)
        if not struck:
            struck.append(step)
            fault(profile / "state.db")
        return out

    monkeypatch.setattr(CatchUp, step, then_fault)
    return struck


def _delete(pointer: Path) -> None:
    os.unlink(pointer)


def _overwrite(pointer: Path) -> None:
    with open(pointer, "r+b") as f:  # through the pointer: the generation file itself
        f.write(b"garbage!" * 512)


def _three_checkpoints(saver: EventlogSaver, cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Thread t1 given three checkpoints: the config of the last and their ids, oldest first."""
    ids = []
    for n in range(3):
        c = _checkpoint(saver, n)
        cfg = saver.put(cfg, c, {"step": n}, c["channel_versions"])  # type: ignore[arg-type]
        ids.append(c["id"])
    return cfg, ids


@pytest.mark.parametrize("step", ["apply", "sync_fts"])
@pytest.mark.parametrize("fault", [_delete, _overwrite], ids=["deleted", "overwritten"])
def test_state_db_broken_between_the_steps_of_a_catch_up_heals_and_the_read_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: Callable[[Path], None], step: str) -> None:
    home = tmp_path / "home"
    cfg = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    with EventlogSaver(home=home) as saver:
        cfg, ids = _three_checkpoints(saver, cfg)
        struck = _once_after(step, monkeypatch, fault, home / "profiles" / "default")
        listed = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "t1"}})]
        assert struck, "the catch-up ran"
        assert listed == ids[::-1]
        c = _checkpoint(saver, 3)
        saver.put(cfg, c, {"step": 3}, c["channel_versions"])  # type: ignore[arg-type]
        assert [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "t1"}})][0] == c["id"]
    assert os.path.exists(home / "profiles" / "default" / "state.db")


def _overwrite_schema_cells(pointer: Path) -> None:
    """The second half of the file's first page -- the cells of its schema table -- overwritten in
    place (a bad disk, a stray write): the file still opens, and the header is intact, but every
    new connection fails on it as 'malformed'."""
    with open(pointer, "r+b") as f:
        size = int.from_bytes(f.read(18)[16:18], "big") or 65536  # the header's page size (no connection
        # of ours: closing the last one would checkpoint the WAL)
        f.seek(size // 2)
        f.write(b"\xa5" * (size // 2))


def test_a_damaged_page_that_the_read_model_read_meets_is_repaired_and_the_read_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The saver's reads of its read model (``SessionStore.read_model``) met a damaged state.db
    with a raw sqlite3.DatabaseError 'database disk image is malformed', on every call, until
    another process or `eventlog doctor --fix` rebuilt the file; the core reads repair it once
    and read again, and so do they now."""
    home = tmp_path / "home"
    cfg = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    with EventlogSaver(home=home) as saver:
        cfg, ids = _three_checkpoints(saver, cfg)
        struck = _once_after("apply", monkeypatch, _overwrite_schema_cells, home / "profiles" / "default")
        for _ in range(2):
            assert [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "t1"}})] == ids[::-1]
        assert struck
    out = subprocess.run([str(Path(sys.executable).with_name("eventlog")), "--home", str(home), "doctor"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
