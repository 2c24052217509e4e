"""pyproject.toml's lower bounds are what `python3 run lowest` installs (tests/lowest.txt), and the
features eventlog relies on in those releases are there (this file runs in that venv too)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _floors() -> dict[str, str]:
    """Each dependency named in pyproject.toml with its ``>=`` bound; one bound per name."""
    found: dict[str, set[str]] = {}
    for name, version in re.findall(r'"([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?>=([0-9.]+)', (ROOT / "pyproject.toml").read_text()):
        found.setdefault(name.lower(), set()).add(version)
    assert all(len(v) == 1 for v in found.values()), f"one package, two lower bounds: {found}"
    return {name: versions.pop() for name, versions in found.items()}


def _pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "tests" / "lowest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"\[.*\]", "", name).lower()] = version
    return pins


def _same(a: str, b: str) -> bool:
    return [int(p) for p in a.split(".")] + [0] * (3 - a.count(".")) == \
        [int(p) for p in b.split(".")] + [0] * (3 - b.count("."))


def test_lowest_txt_pins_each_runtime_and_test_dependency_at_pyprojects_bound() -> None:
    floors, pins = _floors(), _pinned()
    for name in ("orjson", "lmdb", "click", "zstandard", "psycopg", "pytest", "hypothesis", "pytest-xdist"):
        assert name in pins, f"tests/lowest.txt does not pin {name}"
        assert _same(pins[name], floors[name]), f"{name}: pyproject.toml says >={floors[name]}, lowest.txt {pins[name]}"


def test_the_features_the_code_and_tests_use_are_in_the_installed_releases() -> None:
    """Each was missing from a release the bounds allowed before they were raised."""
    import click
    import hypothesis
    from hypothesis import strategies as st

    assert hasattr(hypothesis.HealthCheck, "differing_executors")  # 6.83.2: eventlog/log/contract.py
    st.characters(exclude_categories=["Cs"])  # 6.85.0: the tests' text strategies
    assert hasattr(click.exceptions, "NoArgsIsHelpError")  # 8.2.0: `eventlog` alone is bad usage, exit 2
