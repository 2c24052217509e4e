"""Drop-in faces of eventlog for agent runtimes and frameworks.

Each adapter lives in its own subpackage and is imported only when asked for; the core
(``eventlog.log``, ``eventlog.sessions``, ``projections``) never imports an adapter.
"""
from __future__ import annotations

from typing import NoReturn

from eventlog.errors import extra_install_hint


def missing_extra(error: ModuleNotFoundError, extra: str, packages: tuple[str, ...]) -> NoReturn:
    """Raise ``error`` (a framework package not installed) said the way a user can act on: which
    extra installs it. A module missing for another reason is raised as it was."""
    missing = (error.name or "").split(".")[0]
    if missing not in packages:
        raise error
    raise ModuleNotFoundError(f"this adapter needs the {missing!r} package, which is not installed: "
                              f"{extra_install_hint(extra)}", name=error.name) from error
