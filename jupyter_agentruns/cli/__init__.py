"""``jupyter agentruns``: runs from a terminal.

Against a running server (found as a kernel finds it: ``--url``/``--token``,
``AGENTRUNS_URL``/``AGENTRUNS_TOKEN``, else the one running server):
``list``, ``conversations``, ``show``, ``tail``, ``cancel``, ``answer``, ``export``, ``usage``,
``schedules``,
and ``acp`` (an ACP agent on stdio for editors, forwarding to the server's runs).
On the store itself, no server needed: ``gc``, ``doctor``, ``migrate``, and
``copy`` (a SQLite store into PostgreSQL). Output is for
people; ``--json`` is for scripts. Exit statuses are in ``exits.py``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from ..kernel.client import AgentRunsError, Client, ServerNotFound, find_server
from ..lifecycle import ALL_STATUSES
from . import exits
from .exits import CliError
from .output import one_line

EPILOG = """exit status: 0 ok (tail: the run succeeded), 1 the run failed (doctor: a problem
found), 2 cancelled, 3 interrupted, 64 wrong arguments, 65 the server refused the
request, 66 no such run, 69 no server (or store) reachable, or a store of another
schema version, 77 the token was refused, 78 the Jupyter configuration is wrong,
130 stopped by Ctrl-C"""


STORE_COMMANDS = ("gc", "doctor", "migrate", "copy")
# How long tail waits for a byte before it takes the stream for dead and reconnects.
# The server pings every heartbeat_interval (15 s by default) and does not say
# its own: this leaves room for one set to a minute, twice over.
READ_TIMEOUT_SECONDS = 120


class Parser(argparse.ArgumentParser):
    """argparse's parser, exiting with 64 on a usage error (its own 2 is "cancelled" here)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(exits.USAGE, f"{self.prog}: error: {message}\n")


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def seconds(value: str) -> float:
    number = float(value)
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON, for scripts")
    connection = Parser(add_help=False)
    connection.add_argument(
        "--url", help="the Jupyter server's URL (default: AGENTRUNS_URL, else the running server)"
    )
    connection.add_argument(
        "--token", help="its token (default: AGENTRUNS_TOKEN, else the running server's)"
    )
    server = Parser(add_help=False, parents=[common, connection])
    store = Parser(add_help=False, parents=[common])
    where = store.add_mutually_exclusive_group()
    where.add_argument(
        "--db", metavar="PATH", help="a SQLite store file (default: c.AgentRuns.db_path)"
    )
    where.add_argument(
        "--store-url",
        metavar="URL",
        help="a postgresql:// store (default: c.AgentRuns.store_url, AGENTRUNS_STORE_URL)",
    )

    parser = Parser(
        prog="jupyter agentruns",
        description="Agent runs of Jupyter servers, from a terminal.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )

    listing = commands.add_parser("list", parents=[server], help="your runs, newest first")
    listing.add_argument("--status", choices=ALL_STATUSES)
    listing.add_argument("--session", help="runs of this session (a notebook's path)")
    listing.add_argument("--agent", help="runs of this agent")
    listing.add_argument(
        "--limit", type=positive, default=20, help="at most this many (default 20)"
    )

    talks = commands.add_parser(
        "conversations",
        parents=[server],
        help="your conversations (runs of one session and agent), the newest first",
    )
    talks.add_argument("--agent", help="conversations with this agent")
    talks.add_argument(
        "--notebook",
        metavar="PATH",
        help="conversations of this notebook (its path under the root)",
    )
    talks.add_argument("--limit", type=positive, default=20, help="at most this many (default 20)")

    show = commands.add_parser(
        "show", parents=[server], help="a run: state, timing, what it did, its questions"
    )
    show.add_argument("run", metavar="RUN")

    tail = commands.add_parser(
        "tail", parents=[server],
        help="follow a run's events live; exits with its outcome (0 succeeded, 1 failed, 2 cancelled, 3 interrupted)",
    )  # fmt: skip
    tail.add_argument("run", metavar="RUN")
    tail.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="SEQ",
        help="start after this event (default: from the first)",
    )
    tail.add_argument(
        "--give-up-after",
        type=seconds,
        default=300,
        metavar="SECONDS",
        help="stop when the server stays unreachable this long (default 300)",
    )
    tail.add_argument(
        "--read-timeout",
        type=seconds,
        default=READ_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=argparse.SUPPRESS,
    )

    cancel = commands.add_parser("cancel", parents=[server], help="ask the server to cancel a run")
    cancel.add_argument("run", metavar="RUN")
    cancel.add_argument("--reason", help="recorded with the cancel")

    answer = commands.add_parser(
        "answer", parents=[server], help="answer a run's question (see show)"
    )
    answer.add_argument("run", metavar="RUN")
    answer.add_argument("request", metavar="REQUEST", help="the question's request id")
    answer.add_argument(
        "choice",
        metavar="CHOICE",
        help="one of the choices it offers (a permission's: an id or a name)",
    )
    answer.add_argument("--note", help="a note recorded with the answer")

    export = commands.add_parser(
        "export", parents=[server], help="a run's record: Markdown, or JSON with its events"
    )
    export.add_argument("run", metavar="RUN")
    export.add_argument("--format", choices=("md", "json"), default="md")
    export.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE instead of standard output"
    )

    commands.add_parser("usage", parents=[server], help="your token usage of the last 24 hours")
    commands.add_parser(
        "schedules", parents=[server], help="your schedules, with their next time and last runs"
    )

    bridge = commands.add_parser(
        "acp",
        parents=[connection],  # its output is the protocol's: no --json
        help="an ACP agent on stdio for your editor (Zed, JetBrains, Neovim): its turns are runs",
        description=(
            "Speak the Agent Client Protocol on standard input and output, as an editor's agent "
            "server: each session is a conversation on the Jupyter server, each prompt a run "
            "there, streamed back to the editor with its steps, diffs and questions. The runs "
            "belong to the server: quitting the editor leaves a run going, and loading the "
            "session again shows the whole conversation and follows it."
        ),
        epilog=(
            "The editor starts it: give it --url and --token (or AGENTRUNS_URL and "
            "AGENTRUNS_TOKEN) of the server. A wrong URL or token ends it at once with one "
            "line on standard error. Needs the ACP extra: pip install 'jupyter_agentruns[acp]'."
        ),
    )
    bridge.add_argument(
        "--agent",
        metavar="NAME",
        help="the agent new sessions talk to (default: the server's default_agent); "
        "the editor's mode picker lists the others",
    )

    commands.add_parser(
        "gc", parents=[store], help="apply retention now: delete expired runs, compact old events"
    )
    commands.add_parser(
        "doctor",
        parents=[store],
        help="check the store: where, schema, runs, expired leases, versions",
    )
    commands.add_parser(
        "migrate",
        parents=[store],
        help="create the store's tables, or bring them to this version, and say what was done",
        description=(
            "Create the store, or bring its schema to this package's version, now. Servers do "
            "it at their start when their role may; run this as the schema's owner instead "
            "where the servers' roles may not create tables (a hub's least-privilege roles), "
            "before servers of a new version start. A store already at this version is left "
            "as it is."
        ),
        epilog=(
            "Stop the servers of an older version first: a migrated schema may change beneath "
            "them. On PostgreSQL, tables a migration adds are granted to the servers' roles by "
            "ALTER DEFAULT PRIVILEGES (see the JupyterHub guide)."
        ),
    )
    copy = commands.add_parser(
        "copy",
        parents=[common],
        help="copy the runs of a SQLite store into a PostgreSQL one (several files merge)",
        description=(
            "Copy the runs of a SQLite store into a PostgreSQL one: run ids, events (byte for "
            "byte), snapshots, Idempotency-Keys, tombstones, in submit order. The copy is one "
            "transaction: it is all there or none of it, and a failed copy can be run again. "
            "Copies of several files merge into one schema; a run already there is skipped, "
            "so a second copy of a file changes nothing."
        ),
        epilog=(
            "Stop every server using the SQLite file first: it is opened read-only and never "
            "changed. The target schema is created if missing; servers may use it meanwhile. "
            "Then set c.AgentRuns.store_url (or AGENTRUNS_STORE_URL) to the same URL and "
            "start the servers."
        ),
    )
    copy.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="PATH",
        help="the SQLite file the servers used (their c.AgentRuns.db_path)",
    )
    copy.add_argument(
        "--to",
        dest="target",
        metavar="URL",
        help="postgresql://user:password@host:port/database?schema=NAME "
        "(default: AGENTRUNS_STORE_URL)",
    )
    copy.add_argument(
        "--owner",
        metavar="NAME",
        help="the user who gets the runs of ~shared, the one owner of a single-user server's "
        "runs (a hub's servers show each user their own runs only); other runs keep their owner",
    )
    copy.add_argument(
        "--force",
        action="store_true",
        help="copy active runs too (their server was killed before it could end them): the "
        "first server on PostgreSQL ends them interrupted",
    )
    return parser


def run_command(args: argparse.Namespace, out: TextIO) -> int:
    # Each side imported only when used: the store's side loads the server's code.
    if args.command in STORE_COMMANDS:
        from . import offline

        return offline.COMMANDS[args.command](args, out)
    from . import remote

    server = find_server(
        args.url,
        args.token,
        hint="Pass --url and --token, or set AGENTRUNS_URL and AGENTRUNS_TOKEN.",
    )
    if args.command == "acp":
        try:
            from . import acp_bridge
        except ImportError as error:
            raise CliError(
                f"the ACP bridge needs the ACP SDK ({error}): pip install 'jupyter_agentruns[acp]'",
                exits.CONFIG,
            ) from None
        return acp_bridge.serve(Client(server), args.agent)
    return remote.COMMANDS[args.command](Client(server), args, out)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run one command; returns its exit status (an expected failure is one line on stderr)."""
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    try:
        return run_command(args, out)
    except (CliError, AgentRunsError, ServerNotFound) as error:
        failure = exits.from_api(error) if isinstance(error, AgentRunsError) else error
        # The server's and the run's words may be in it: one line, controls escaped.
        sys.stderr.write(f"jupyter agentruns {args.command}: {one_line(str(failure))}\n")
        return failure.status if isinstance(failure, CliError) else exits.UNAVAILABLE
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return exits.STOPPED
    except BrokenPipeError:
        # The reader went away (| head): nothing more to say, to anyone.
        sys.stderr.close()
        return exits.OK
