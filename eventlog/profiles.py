"""Where profiles live: ``$EVENTLOG_HOME/profiles/<profile>/``.

Profile names are checked before any path is built, so a hostile name never touches the disk.
Directories are created 0700 and files 0600, whatever the process umask.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from eventlog.errors import ProfileNameError

PROFILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_PROFILE = "default"
DIR_MODE = 0o700
FILE_MODE = 0o600


def validate_profile(name: object) -> str:
    """Return ``name`` if it is a valid profile name, else raise :class:`ProfileNameError`."""
    if type(name) is not str or not PROFILE_RE.fullmatch(name):
        raise ProfileNameError(
            "profile",
            f"{name!r} must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}",
            hint="use letters, digits, '_', '.', '-' (first a letter or digit), at most 64 characters",
        )
    return name


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The eventlog home: ``home``, else ``$EVENTLOG_HOME``, else ``~/.eventlog``."""
    if home is None:
        home = os.environ.get("EVENTLOG_HOME") or Path.home() / ".eventlog"
    return Path(home).expanduser().absolute()


def profile_dir(home: str | os.PathLike[str] | None, profile: str, *, create: bool = True) -> Path:
    """The directory of ``profile`` under ``home``; created 0700 (with its parents) if ``create``."""
    validate_profile(profile)
    d = resolve_home(home) / "profiles" / profile
    if create:
        make_dir(d)
    return d


def make_dir(path: Path) -> None:
    """Create ``path`` and missing parents with mode 0700 (existing directories are left alone)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(d, DIR_MODE)


def restrict_file(path: str | os.PathLike[str]) -> None:
    """Make an existing file 0600 (no-op if it is gone)."""
    try:
        os.chmod(path, FILE_MODE)
    except FileNotFoundError:
        pass


def list_profiles(home: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the profiles that exist under ``home``."""
    root = resolve_home(home) / "profiles"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and PROFILE_RE.fullmatch(p.name))
