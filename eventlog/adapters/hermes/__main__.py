"""``python -m eventlog.adapters.hermes [hermes arguments...]``: run Hermes' ``hermes`` command
with eventlog's SessionDB installed (e.g. ``python -m eventlog.adapters.hermes sessions list``).

``python -m eventlog.adapters.hermes agent ...`` runs ``hermes-agent`` and ``... acp ...`` runs
``hermes-acp`` the same way.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from eventlog.adapters.hermes.installing import HERMES_MISSING_HINT, install

    try:
        install()
    except ModuleNotFoundError as e:
        if e.name != "hermes_state":
            raise
        print(f"error: Hermes Agent is not installed (no module hermes_state) (hint: {HERMES_MISSING_HINT})",
              file=sys.stderr)
        return 1
    entry, name = "hermes_cli.main", "hermes"
    if args[:1] == ["agent"]:
        entry, name, args = "run_agent", "hermes-agent", args[1:]
    elif args[:1] == ["acp"]:
        entry, name, args = "acp_adapter.entry", "hermes-acp", args[1:]
    import importlib

    module = importlib.import_module(entry)
    sys.argv = [name, *args]
    result = module.main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
