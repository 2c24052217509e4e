"""The ``eventlog`` command line: thin commands over library calls.

``main`` is the click group behind the ``eventlog`` console script (:mod:`eventlog.cli.app`);
each command group lives in a module of its own and is imported on first use.
"""
from __future__ import annotations

from eventlog.cli.app import main

__all__ = ["main"]
