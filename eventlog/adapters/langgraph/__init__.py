"""LangGraph checkpoints on eventlog: :class:`EventlogSaver` (needs ``eventlog[langgraph]``).

``eventlog.adapters.langgraph.model`` (the events and the read model) imports no LangGraph;
the saver is loaded on first use of the name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventlog.adapters.langgraph.saver import EventlogSaver

__all__ = ["EventlogSaver"]


def __getattr__(name: str) -> Any:
    if name == "EventlogSaver":
        from eventlog.adapters import missing_extra

        try:
            from eventlog.adapters.langgraph.saver import EventlogSaver
        except ModuleNotFoundError as e:
            missing_extra(e, "langgraph", ("langgraph", "langchain_core"))

        return EventlogSaver
    raise AttributeError(f"module 'eventlog.adapters.langgraph' has no attribute {name!r}")
