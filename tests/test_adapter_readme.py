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
                          env=dict(os.environ, EVENTLOG_HOME=str(tmp_path), PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert "OPENAI_API_KEY" not in done.stderr, done.stderr  # as a user runs it: no tracing noise
    shown = re.findall(r"print\(.*\)  # (.*?)(?: \(then .*)?$", code, re.M)  # what the comment says it prints
    assert shown and done.stdout.strip() == shown[-1], (done.stdout, shown)
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, EVENTLOG_HOME=str(tmp_path), PYTHONPATH=str(ROOT)))
    then = re.search(r"\(then (\d+)", code)  # a second run: the conversation is kept
    assert again.returncode == 0 and again.stdout.split()[-1] == (then.group(1) if then else shown[-1].split()[-1])
    assert "Traceback" not in done.stderr
    cli = [sys.executable, "-c", "import sys; from eventlog.cli import main; sys.exit(main())"]
    search = subprocess.run([*cli, "--home", str(tmp_path), "search", "hello", "--json"], capture_output=True,
                            text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert search.returncode == 0 and '"results"' in search.stdout and "hello" in search.stdout.lower(), search.stderr


def _owner(module: str) -> str:
    """The installed distribution that holds ``module``'s file (a namespace package such as
    ``langgraph`` is shared by several: the submodule's file decides). Every distribution's file
    list is read: md.packages_distributions() of Python 3.10 reads only top_level.txt, which
    openai-agents and langgraph do not ship, and found no distribution for them."""
    import importlib.metadata as md
    import importlib.util

    from packaging.utils import canonicalize_name

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    origin = Path(spec.origin).resolve()
    top = module.split(".")[0]
    for dist in md.distributions():
        mine = [f for f in dist.files or [] if f.parts[:1] == (top,)]
        if any(Path(str(dist.locate_file(f))).resolve() == origin for f in mine):
            return canonicalize_name(dist.metadata["Name"])
    raise AssertionError(f"no installed distribution holds {module} ({origin})")


def _closure(extra: str) -> set[str]:
    """Every distribution ``pip install 'eventlog[extra]'`` brings in (extras of dependencies aside)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def deps(name: str, extras: set[str]) -> list[Requirement]:
        out = []
        for line in md.requires(name) or []:
            r = Requirement(line)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras or {""}):
                out.append(r)
        return out

    seen: set[str] = set()
    todo = [r for r in deps("eventlog", {extra}) if r.marker is not None and "extra" in str(r.marker)]
    while todo:
        r = todo.pop()
        name = canonicalize_name(r.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += deps(r.name, set(r.extras))
        except md.PackageNotFoundError:
            pass
    return seen


@pytest.mark.parametrize("index", range(2))
def test_the_readme_install_line_brings_what_its_example_imports(index: int) -> None:
    """``pip install -e '.[openai-agents]'`` / ``'.[langgraph]'`` (the README's line, in the clone)
    must install every package the README's example for that framework imports."""
    import ast

    code = examples()[index]
    extra = "openai-agents" if "openai_agents" in code else "langgraph"
    assert f"'.[{extra}]'" in (ROOT / "README.md").read_text(encoding="utf-8")
    modules = {n.module for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {a.name for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Import) for a in n.names}
    third_party = sorted(m for m in modules if m.split(".")[0] not in sys.stdlib_module_names | {"eventlog"})
    assert third_party, code
    brought = _closure(extra)
    missing = {m: _owner(m) for m in third_party if _owner(m) not in brought}
    assert missing == {}, f"eventlog[{extra}] does not install {missing}"


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


@pytest.mark.parametrize("blocked, statement, extra", [
    ("agents", "from eventlog.adapters.openai_agents import EventlogSession", "openai-agents"),
    ("langgraph", "from eventlog.adapters.langgraph import EventlogSaver", "langgraph"),
    ("langchain_core", "from eventlog.adapters.langgraph import EventlogSaver", "langgraph"),
])
def test_an_adapter_without_its_framework_names_the_extra_to_install(blocked: str, statement: str, extra: str) -> None:
    """An adapter imported where its framework is not installed says which extra installs it (it
    was a bare ModuleNotFoundError naming langchain_core or agents; outside audit, helper-58).
    The framework is made unimportable the way Python marks a module missing (None in
    sys.modules), in a process of its own."""
    code = f"import sys; sys.modules[{blocked!r}] = None\n{statement}\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ") and f"(eventlog's [{extra}] extra)" in last, r.stderr
    assert repr(blocked) in last, r.stderr
    assert_installs_the_extra(last, extra)


def assert_installs_the_extra(hint: str, extra: str) -> None:
    """The hint's pip command names the extra's own requirements, never ``eventlog[extra]``: the
    name eventlog on PyPI is another project's (``pip install 'eventlog[postgres]'`` brought
    eventlog 0.11.0 and Django), so copying that hint installed the wrong package."""
    import shlex

    from packaging.requirements import Requirement

    assert "eventlog[" not in hint, hint
    command = shlex.split(hint.split("pip install ", 1)[1].split(" (eventlog's", 1)[0])
    names = {Requirement(arg).name for arg in command}
    assert names == {Requirement(r).name for r in _extra_requirements(extra)}, hint


def _extra_requirements(extra: str) -> list[str]:
    import importlib.metadata as md

    from packaging.requirements import Requirement

    return [line.split(";")[0] for line in md.requires("eventlog") or []
            if Requirement(line).marker is not None and Requirement(line).marker.evaluate({"extra": extra})
            and not Requirement(line).marker.evaluate({"extra": ""})]


def test_a_postgresql_log_without_psycopg_names_what_to_install(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "from eventlog.log import open_log\n"
            "open_log('postgresql://u:p@127.0.0.1:1/db', profile='p')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "a postgresql:// log needs psycopg 3" in last, r.stderr
    assert_installs_the_extra(last, "postgres")


def test_without_installed_metadata_the_hint_names_the_source_folder(tmp_path: Path) -> None:
    """Run from a source tree that was never installed (its folder on PYTHONPATH, no eventlog
    metadata anywhere on the path), the hint said ``pip install -e '<eventlog source folder>[postgres]'``:
    a placeholder that fails when copied. It now names the folder this eventlog is imported from."""
    import shlex
    import site

    packages = Path(site.getsitepackages()[0])
    bare = tmp_path / "site"  # the environment's packages without eventlog's metadata or finder
    bare.mkdir()
    for entry in packages.iterdir():
        if "eventlog" not in entry.name.lower() and not entry.name.endswith(".pth"):
            (bare / entry.name).symlink_to(entry)
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "import importlib.metadata as md\n"
            "try:\n    md.requires('eventlog'); sys.exit('eventlog metadata found')\n"
            "except md.PackageNotFoundError:\n    pass\n"
            "from eventlog.log import open_log\n"
            "open_log('postgresql://u:p@127.0.0.1:1/db', profile='p')\n")
    # The source tree copied without what an install leaves in it (the clone CI installs holds
    # eventlog.egg-info, which is metadata): its packages and its pyproject.toml only.
    import shutil

    source = tmp_path / "src"
    for name in ("eventlog", "projections", "sqlite_export"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source / "pyproject.toml")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source), str(bare)]))
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env)
    assert r.returncode == 1 and "a postgresql:// log needs psycopg 3" in r.stderr, r.stderr
    hint = r.stderr.strip().splitlines()[-1].split("hint: ", 1)[-1].rstrip(")")
    assert "<eventlog source folder>" not in hint and "eventlog[" not in hint, hint
    assert shlex.split(hint.split("pip install -e ", 1)[1]) == [f"{source}[postgres]"], hint
