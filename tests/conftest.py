"""Shared fixtures. Every test gets its own EVENTLOG_HOME under tmp_path."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("default", max_examples=int(os.environ.get("EVENTLOG_EXAMPLES", "100")), deadline=None)
settings.register_profile("campaign", max_examples=5000, deadline=None)
settings.load_profile("campaign" if os.environ.get("EVENTLOG_CAMPAIGN") else "default")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("EVENTLOG_HOME", str(h))
    return h
