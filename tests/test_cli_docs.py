"""The CLI's surface: every command documented in the README with its options and has help text,
and the commands load lazily (``--help`` and ``log verify`` import only what they need)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from eventlog.cli import main
from eventlog.cli.app import COMMANDS, LazyGroup

README = Path(__file__).resolve().parents[1] / "README.md"

# The command modules of the CLI (besides the package and the group itself).
COMMAND_MODULES = sorted({entry.module for entry in COMMANDS.values()})
# What neither `--help` nor a command's help may load: the log backend, the domain, SQLite.
HEAVY = ("lmdb", "sqlite3", "_sqlite3", "eventlog.log", "eventlog.sessions", "projections", "sqlite_export", "orjson")


def walk(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command under ``cmd`` (groups included), found through the group API as click finds them."""
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=path[-1] if path else "eventlog")
        names = cmd.list_commands(ctx)
        assert names, f"group {' '.join(path) or 'eventlog'} has no commands"
        for name in names:
            sub = cmd.get_command(ctx, name)
            assert sub is not None, f"{' '.join((*path, name))} is listed but cannot be loaded"
            found += walk(sub, (*path, name))
    return found


ALL = walk(main)
LEAVES = [(path, cmd) for path, cmd in ALL if not isinstance(cmd, click.Group)]


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _ in LEAVES}
    assert len(LEAVES) >= 20, sorted(names)
    assert {"init", "append", "log tail", "log verify", "sessions list", "sessions show", "messages add", "search",
            "rebuild", "doctor", "replay", "export", "import", "stats", "demo"} <= names


@pytest.mark.parametrize("path,cmd", ALL, ids=[" ".join(p) or "eventlog" for p, _ in ALL])
def test_every_command_has_help_text(path: tuple[str, ...], cmd: click.Command) -> None:
    assert (cmd.help or "").strip(), f"`eventlog {' '.join(path)}` has no help text"


def readme_lines(path: tuple[str, ...]) -> list[str]:
    pattern = re.compile(rf"eventlog {re.escape(' '.join(path))}(?![\w-])")
    return [line for line in README.read_text().splitlines() if pattern.search(line)]


@pytest.mark.parametrize("path,cmd", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_and_its_options_are_in_the_readme(path: tuple[str, ...], cmd: click.Command) -> None:
    lines = readme_lines(path)
    assert lines, f"`eventlog {' '.join(path)}` is not in the README"
    for param in cmd.params:
        flags = [o for o in param.opts if o.startswith("--") and o != "--help"]
        if isinstance(param, click.Option) and flags:
            assert any(f in line for f in flags for line in lines), \
                f"`eventlog {' '.join(path)}`: option {flags[0]} is not on its README line"


def test_the_global_options_are_in_the_readme() -> None:
    usage = [line for line in README.read_text().splitlines() if "eventlog [--home DIR] [--profile NAME]" in line]
    assert usage, "the README does not show `eventlog [--home DIR] [--profile NAME] COMMAND`"
    assert {o for p in main.params for o in p.opts if o.startswith("--")} == {"--home", "--profile", "--log-url",
                                                                              "--version"}
    assert any("--log-url" in line for line in usage)
    assert "eventlog --version" in README.read_text()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_short_help_of_the_command_table_is_the_commands_own(name: str) -> None:
    group = main
    assert isinstance(group, LazyGroup)
    cmd = group.get_command(click.Context(group), name)
    assert cmd is not None
    assert COMMANDS[name].help == cmd.get_short_help_str(limit=10_000), \
        f"eventlog.cli.app.COMMANDS[{name!r}].help differs from the command's first sentence"


def loaded_after(*argv: str, home: Path | None = None) -> tuple[int, list[str]]:
    """Run ``eventlog ARGV`` in a fresh interpreter; its exit code and the modules it loaded."""
    code = ("import sys, json, atexit\n"
            "atexit.register(lambda: sys.__stderr__.write('MODULES' + json.dumps(sorted(sys.modules))))\n"
            "from eventlog.cli import main\n"
            f"main({list(argv)!r}, prog_name='eventlog')\n")
    env = None
    if home is not None:
        import os

        env = dict(os.environ, EVENTLOG_HOME=str(home))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return r.returncode, json.loads(r.stderr.split("MODULES", 1)[1])


def heavy(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if m in prefixes or m.startswith(tuple(p + "." for p in prefixes))]


def test_help_loads_no_command_module_nor_the_library() -> None:
    code, modules = loaded_after("--help")
    assert code == 0
    assert heavy(modules, HEAVY) == []
    assert [m for m in modules if m in COMMAND_MODULES] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_commands_help_loads_only_its_own_module(name: str) -> None:
    code, modules = loaded_after(name, "--help")
    assert code == 0
    assert heavy(modules, HEAVY) == []
    assert [m for m in modules if m in COMMAND_MODULES] == [COMMANDS[name].module]


def test_log_verify_loads_neither_the_domain_nor_sqlite(tmp_path: Path) -> None:
    code, _ = loaded_after("--profile", "p", "init", home=tmp_path)
    assert code == 0
    code, modules = loaded_after("--profile", "p", "log", "verify", home=tmp_path)
    assert code == 0
    assert "eventlog.log.lmdb" in modules
    assert heavy(modules, ("sqlite3", "_sqlite3", "eventlog.sessions", "projections", "sqlite_export")) == []


def test_the_readmes_python_example_runs_and_runs_again(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no Python example"
    import os

    env = dict(os.environ, EVENTLOG_HOME=str(tmp_path / "home"))
    for _ in range(2):  # a second run in the same home must work too (no title or id clashes)
        for code in blocks:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
            assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("width", [60, 100])
@pytest.mark.parametrize("argv", [["--help"], [], ["sesions"], ["expor", "x"], ["sessions", "lst"]])
def test_lazy_loading_prints_what_an_eager_group_prints(argv: list[str], width: int) -> None:
    from click.testing import CliRunner

    assert isinstance(main, LazyGroup)
    ctx = click.Context(main)
    loaded = {name: main.get_command(ctx, name) for name in COMMANDS}
    common: dict[str, Any] = dict(name="eventlog", params=main.params, help=main.help, callback=main.callback,
                                  context_settings=main.context_settings)
    eager = click.Group(commands={n: c for n, c in loaded.items() if c is not None}, **common)
    fresh = LazyGroup(lazy=COMMANDS, **common)  # nothing loaded yet
    got = [CliRunner().invoke(g, argv, prog_name="eventlog", terminal_width=width) for g in (fresh, eager)]
    assert (got[0].exit_code, got[0].output) == (got[1].exit_code, got[1].output)
    assert got[0].exit_code == (0 if argv == ["--help"] else 2)


def test_python_dash_m_eventlog_cli_is_the_command(tmp_path: Path) -> None:
    """`python -m eventlog.cli` failed ("is a package and cannot be directly executed"): two
    outside audits reached for it where the console script was not on PATH."""
    import subprocess
    import sys

    run = [sys.executable, "-m", "eventlog.cli", "--home", str(tmp_path), "--profile", "p"]
    helped = subprocess.run([sys.executable, "-m", "eventlog.cli", "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: eventlog ")
    made = subprocess.run([*run, "sessions", "new", "--title", "via -m"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    listed = subprocess.run([*run, "sessions", "list", "--json"], capture_output=True, text=True)
    assert listed.returncode == 0 and "via -m" in listed.stdout
    bad = subprocess.run([*run, "sessions", "show", "nope"], capture_output=True, text=True)
    assert bad.returncode == 1  # exit codes pass through


def test_doctors_help_names_every_part_of_its_report(tmp_path: Path) -> None:
    """`eventlog doctor` reports a `disk` part (free space, a read-only file system) that its help
    did not name: a user reading `doctor --help` could not know it checks the disk."""
    from click.testing import CliRunner

    home = ["--home", str(tmp_path), "--profile", "p"]
    assert CliRunner().invoke(main, [*home, "init"]).exit_code == 0
    done = CliRunner().invoke(main, [*home, "doctor", "--json"])
    assert done.exit_code == 0, done.output
    parts = set(json.loads(done.output)) - {"ok"}
    words = {"log": "the log", "state": "state.db", "fts": "FTS index", "lease": "lease", "disk": "disk",
             "permissions": "permissions"}
    assert parts == set(words)
    shown = CliRunner().invoke(main, ["doctor", "--help"], terminal_width=10_000).output
    assert [p for p in sorted(parts) if words[p] not in shown] == []
