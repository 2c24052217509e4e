"""The read surface: what a read model provides, and the one check of read parameters.

Every read method (``get_session``, ``list_sessions``, ``get_messages``, ``get_usage``,
``get_reactions``, ``search``, ``stats``) takes explicit parameters and is wrapped by
:func:`typed_read`, which checks the call against the method's own signature before anything is
read: an unknown parameter name, a missing required one, a value of the wrong type, or a negative
``limit``/``offset`` raise :class:`ValidationError` naming the parameter. The signature is the
contract; the annotations allowed are ``str``, ``bool`` and ``int``, each optionally ``| None``.
A ``bool`` is never accepted as an ``int`` (nor an ``int`` as a ``bool``); text may be any
``str`` (a query with lone surrogates simply matches nothing), except a ``role``, which must be
one of the catalogue's roles (a typo would match nothing without a word).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Protocol, TypeVar, cast

from eventlog.errors import ValidationError

F = TypeVar("F", bound=Callable[..., Any])
Check = Callable[[Any, str], None]

NON_NEGATIVE = frozenset({"limit", "offset"})
"""Parameters that count rows: an int >= 0 (``limit=None``, where allowed, means no limit)."""
CLOSED_SETS = {"role": ("system", "user", "assistant", "tool", "session_meta")}
"""Parameters whose text is one of a fixed set (a typo would match nothing, silently): the roles,
as :data:`eventlog.sessions.events.ROLES`."""

_TYPES: dict[str, type] = {"str": str, "bool": bool, "int": int}
_NAMES = {str: "a string", bool: "true or false", int: "an integer"}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _annotation_parts(annotation: Any) -> list[str]:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return [part.strip() for part in text.split("|")]


def _check_for(name: str, annotation: Any, where: str) -> Check:
    parts = _annotation_parts(annotation)
    optional = "None" in parts
    names = [p for p in parts if p != "None"]
    if len(names) != 1 or names[0] not in _TYPES:
        raise TypeError(f"{where}: parameter {name!r} is annotated {annotation!r}; "
                        "typed_read knows str, bool and int, each optionally | None")
    wanted = _TYPES[names[0]]
    described = _NAMES[wanted] + (" or null" if optional else "")
    counts = name in NON_NEGATIVE
    closed = CLOSED_SETS.get(name)

    def check(value: Any, field: str) -> None:
        if type(value) is wanted:  # the common case, first
            if counts and cast(int, value) < 0:
                raise ValidationError(field, f"must be 0 or more, got {value}")
            if closed is not None and value not in closed:
                raise ValidationError(field, f"must be one of {', '.join(closed)}, got {value!r}")
            return
        if value is None:
            if not optional:
                raise ValidationError(field, f"must be {described}, got null")
            return
        if wanted is bool:
            ok = isinstance(value, bool)
        elif wanted is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ValidationError(field, f"must be {described}, got {_kind(value)}")
        if counts and value < 0:
            raise ValidationError(field, f"must be 0 or more, got {value}")
        if closed is not None and value not in closed:
            raise ValidationError(field, f"must be one of {', '.join(closed)}, got {str(value)!r}")

    return check


def typed_read(fn: F) -> F:
    """Wrap a read method so that a bad call raises :class:`ValidationError` naming the
    parameter (never ``TypeError`` or ``ValueError``); a good call reaches ``fn`` unchanged,
    every argument passed by keyword. See the module docstring for what is checked."""
    where = fn.__qualname__
    params = list(inspect.signature(fn).parameters.values())[1:]  # after self
    for p in params:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"{where}: a read takes named parameters only, not {p}")
    checks = {p.name: _check_for(p.name, p.annotation, where) for p in params}
    positional = tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
    required = tuple(p.name for p in params if p.default is p.empty)
    listing = ", ".join(checks) or "none"

    @functools.wraps(fn)
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            if len(args) > len(positional):
                raise ValidationError(
                    "arguments", f"{where} takes {len(positional)} positional argument(s), got {len(args)}",
                    hint=f"pass the others by name ({listing})")
            for name, value in zip(positional, args):
                if name in kwargs:
                    raise ValidationError(name, "given twice (by position and by name)")
                kwargs[name] = value
        for name, value in kwargs.items():
            check = checks.get(name)
            if check is None:
                raise ValidationError(name, f"not a parameter of {where}", hint=f"its parameters: {listing}")
            check(value, name)
        if len(kwargs) < len(checks):
            for name in required:
                if name not in kwargs:
                    raise ValidationError(name, f"is required by {where}")
        return fn(self, **kwargs)

    return cast(F, read)


class ReadModel(Protocol):
    """What SessionStore needs from a read model (the fold and the projections provide it).

    The read methods answer as docs/EVENTS.md describes and raise :class:`ValidationError` for a
    bad call (see :func:`typed_read`); the helpers above them are what writers check before
    appending, called only with values the store has validated.
    """

    def advance(self, to_seq: int | None = None, wait: float | None = None) -> object:
        """Return once the read model includes event ``to_seq`` (None: the log head now);
        raise :class:`eventlog.errors.EventLogError` when it cannot within ``wait`` seconds."""
        ...
    def is_live(self, session_id: str) -> bool: ...
    def title_holder(self, title: str) -> str | None: ...
    def titles(self) -> set[str]: ...
    def message_session(self, message_id: int) -> str | None: ...
    def current_reaction(self, message_id: int, author: str) -> str | None: ...
    def lineage(self, session_id: str) -> list[str]: ...
    def unseen_reactions(self, session_id: str) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...

    def get_session(self, session_id: str) -> dict[str, Any] | None: ...
    def list_sessions(self, *, source: str | None = None, archived: bool | None = False,
                      pinned: bool | None = None, hidden: bool | None = False, children: bool = True,
                      workspace: str | None = None, limit: int | None = 50,
                      offset: int = 0) -> list[dict[str, Any]]: ...
    def get_messages(self, session_id: str, *, include_inactive: bool = False, limit: int | None = None,
                     before: int | None = None, after: int | None = None,
                     newest_first: bool = False) -> list[dict[str, Any]]: ...
    def get_usage(self, session_id: str) -> list[dict[str, Any]]: ...
    def get_reactions(self, message_id: int) -> list[dict[str, Any]]: ...
    def search(self, query: str, *, role: str | None = None, source: str | None = None,
               session_id: str | None = None, limit: int | None = 20) -> dict[str, Any]: ...
    def stats(self) -> dict[str, Any]: ...
