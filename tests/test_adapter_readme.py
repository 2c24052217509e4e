"""The README's framework examples run as written (each in a fresh process, in a temporary home)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def examples() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return [b for b in blocks if "eventlog.adapters." in b]


def test_the_readme_has_one_example_per_framework() -> None:
    found = examples()
    assert sum("openai_agents" in b for b in found) == 1
    assert sum("adapters.langgraph" in b for b in found) == 1


@pytest.mark.parametrize("index", range(2))
def test_readme_example_runs(tmp_path: Path, index: int) -> None:
    code = examples()[index]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, EVENTLOG_HOME=str(tmp_path), PYTHONPATH=str(ROOT),
                                   OPENAI_AGENTS_DISABLE_TRACING="1"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the example prints what it shows"
    assert "Traceback" not in done.stderr
    cli = [sys.executable, "-c", "import sys; from eventlog.cli import main; sys.exit(main())"]
    search = subprocess.run([*cli, "--home", str(tmp_path), "search", "hello", "--json"], capture_output=True,
                            text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert search.returncode == 0 and '"results"' in search.stdout and "hello" in search.stdout.lower(), search.stderr


def test_the_core_imports_no_framework_and_no_adapter() -> None:
    import ast

    frameworks = ("agents", "langgraph", "langchain_core", "langchain")
    bad = []
    for layer in ("eventlog/log", "eventlog/sessions", "eventlog/cli", "projections", "sqlite_export"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
                bad += [f"{path.relative_to(ROOT)} imports {n}" for n in names
                        if n.split(".")[0] in frameworks or n.startswith("eventlog.adapters")]
    assert bad == []
