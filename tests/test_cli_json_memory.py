"""A ``--json`` output is written as orjson's UTF-8 bytes to a UTF-8 stdout. It was made a str
first (4 bytes a character as soon as it holds one emoji) and encoded again: `sessions show
--json` of a session of 200,000 messages peaked at 3.9 GB for 334 MB of output; 1.7 GB now,
the same bytes (outside audit, helper-87). Counted as the peak of Python's allocations."""
from __future__ import annotations

import io
import sys
import tracemalloc
from pathlib import Path

import orjson
import pytest

from eventlog.cli.common import emit_json


def test_json_output_is_not_held_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    obj = {"messages": [{"id": i, "content": "café 🙂 " + "x" * 1000} for i in range(2000)]}
    expected = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"
    with open(tmp_path / "out", "wb") as raw:
        out = io.TextIOWrapper(raw, encoding="utf-8")
        monkeypatch.setattr(sys, "stdout", out)
        tracemalloc.start()
        try:
            emit_json(obj)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        out.flush()
    assert (tmp_path / "out").read_bytes() == expected
    assert peak < 3 * len(expected)  # it was ~12x: the bytes, a str of 4 bytes a character, its encoding


def test_a_stdout_that_is_not_utf8_still_gets_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tmp_path / "out", "wb") as raw:
        out = io.TextIOWrapper(raw, encoding="ascii")
        monkeypatch.setattr(sys, "stdout", out)
        emit_json({"content": "café 🙂"})
        out.flush()
    assert (tmp_path / "out").read_bytes() == b'{\n  "content": "caf\\u00e9 \\ud83d\\ude42"\n}\n'


def test_a_stdout_of_text_only_gets_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stdout with no bytes under it (``contextlib.redirect_stdout(io.StringIO())``, as a caller
    embedding the CLI captures it): the bytes went to ``write`` of a text stream, a TypeError
    traceback instead of the JSON."""
    import contextlib

    from eventlog.cli import main

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        main(["--home", str(tmp_path), "sessions", "new", "--id", "s1", "--title", "café 🙂"], standalone_mode=False)
        main(["--home", str(tmp_path), "sessions", "list", "--json"], standalone_mode=False)
    listed = captured.getvalue().split("\n", 1)[1]
    assert [(s["id"], s["title"]) for s in orjson.loads(listed)] == [("s1", "café 🙂")]
