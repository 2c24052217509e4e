"""The ``eventlog`` group: the global options and the table of commands, each loaded on first use.

Exit codes: 0 success, 1 a failed check or an error (one line on stderr, with a hint where
one helps), 2 bad usage (click's own handling).

A command's module is imported only when that command runs or shows its help, and the
commands import the library inside their bodies: ``eventlog --help`` loads click and this
module, ``eventlog log verify`` adds the LMDB log and never the projections or SQLite.
"""
from __future__ import annotations

import importlib
from gettext import gettext as _
from typing import Any, Mapping, NamedTuple

import click

from eventlog.profiles import DEFAULT_PROFILE


class Lazy(NamedTuple):
    """Where a command lives, and its short help for the group's ``--help``."""

    module: str
    attr: str
    help: str
    """The first sentence of the command's help (tests/test_cli_docs.py holds the two equal)."""


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use.

    ``lazy`` maps a command name to a :class:`Lazy`. Listing the commands (the group's
    ``--help``) reads the table alone and imports nothing; running a command, or asking for its
    help, imports its module only. Output is click's own, word for word.
    """

    def __init__(self, *args: Any, lazy: Mapping[str, Lazy] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Lazy] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and args[0] not in self.lazy:
            # An unknown name: load every command so that click's "Did you mean ...?" sees them all.
            for name in self.lazy:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's layout; a command not loaded yet shows the short help from the table.
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name)
            if cmd is None:
                cmd = click.Command(name, help=self.lazy[name].help)
            if not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _cmd in rows)
            with formatter.section(_("Commands")):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])

    def _load(self, name: str) -> None:
        entry = self.lazy[name]
        cmd = getattr(importlib.import_module(entry.module), entry.attr)
        if not isinstance(cmd, click.Command):
            raise TypeError(f"{entry.module}.{entry.attr} is not a click command")
        self.add_command(cmd, name)


COMMANDS: dict[str, Lazy] = {
    "init": Lazy("eventlog.cli.append", "init",
                 "Create the profile (its directory and log) if it does not exist."),
    "append": Lazy("eventlog.cli.append", "append",
                   'Append JSONL events from stdin: one {"type", "session"?, "data", "id"?} per line.'),
    "log": Lazy("eventlog.cli.log", "log", "Inspect, verify and copy the event log itself."),
    "sessions": Lazy("eventlog.cli.sessions", "sessions", "Create, list, show and change sessions."),
    "messages": Lazy("eventlog.cli.messages", "messages", "Add messages to sessions."),
    "search": Lazy("eventlog.cli.search", "search",
                   "Full-text search over messages (any text is accepted as a query)."),
    "stats": Lazy("eventlog.cli.stats", "stats",
                  "Sessions and messages by source, token and cost totals, log size and head, projection lag."),
    "rebuild": Lazy("eventlog.cli.repair", "rebuild",
                    "Rebuild projections from the log into new files and swap them in (the log is not written)."),
    "doctor": Lazy("eventlog.cli.repair", "doctor",
                   "Check the log, state.db, the FTS index, cursors, the lease, disk space and file permissions."),
    "replay": Lazy("eventlog.cli.transfer", "replay",
                   "Write a standalone state.db (with its FTS index) of the profile as it was at a point."),
    "export": Lazy("eventlog.cli.transfer", "export_cmd",
                   "Export the profile to OUT ('-' for stdout with jsonl, md and html)."),
    "import": Lazy("eventlog.cli.transfer", "import_cmd",
                   "Import FILE into the profile (created if it does not exist)."),
    "retention": Lazy("eventlog.cli.erase", "retention",
                      "Erase every lineage (a session and its descendants) whose last activity, in any of its "
                      "sessions, is older than a duration."),
    "compact": Lazy("eventlog.cli.erase", "compact",
                    "Rewrite the log file with only its live pages, giving freed space back (crash-safe)."),
    "demo": Lazy("eventlog.cli.demo", "demo",
                 "Write a realistic agent conversation into the demo profile (or the one --profile names), read "
                 "it back, verify the log."),
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="eventlog", message="%(prog)s %(version)s")
@click.option("--home", metavar="DIR", default=None, envvar="EVENTLOG_HOME",
              help="Home directory (default: $EVENTLOG_HOME or ~/.eventlog).")
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True, help="Profile name.")
@click.option("--log-url", metavar="URL", default=None, envvar="EVENTLOG_LOG_URL",
              help="Keep the profile's log on PostgreSQL (postgresql://user:pw@host/db), or in the LMDB log "
                   "directory given, instead of in the home; the profile's projections follow that log "
                   "(default: $EVENTLOG_LOG_URL).")
@click.pass_context
def main(ctx: click.Context, home: str | None, profile: str, log_url: str | None) -> None:
    """eventlog: an event-sourced session store for AI-agent runtimes."""
    from eventlog.cli.common import Ctx, need_stdout, on_terminate, setup_logging, setup_streams
    from eventlog.errors import ValidationError

    need_stdout()
    setup_streams()
    setup_logging()
    on_terminate(ctx)
    from eventlog.profiles import validate_profile

    try:
        validate_profile(profile)
    except ValidationError as e:
        raise click.BadParameter(str(e), param_hint="--profile") from None
    if log_url == "" and ctx.get_parameter_source("log_url") == click.core.ParameterSource.COMMANDLINE:
        # an empty $EVENTLOG_LOG_URL means "not set"; typed on the command line it is a mistake, and
        # going on would quietly use the home's log instead of the server the user meant
        raise click.BadParameter("must not be empty", param_hint="--log-url")
    try:
        ctx.obj = Ctx(home, profile, log_url or None)
    except ValidationError as e:  # an empty home, a NUL, a path through a file: bad usage
        given = home is not None and ctx.get_parameter_source("home") == click.core.ParameterSource.COMMANDLINE
        raise click.BadParameter(str(e), param_hint="--home" if given else "$EVENTLOG_HOME") from None
