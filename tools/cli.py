"""``logstore`` console script: a thin argparse front over the subcommand modules.

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed namespace, returning an exit code). Adding a subcommand is one line in
``SUBCOMMAND_MODULES``; modules are imported only to register, and keep heavy imports inside ``func``.

Errors: a command maps the failures it expects to its own message and exit code; anything else that is an
``OSError`` or a ``LogstoreError`` (a data dir that is a file or not writable, a full disk) is printed here
as one line ``logstore COMMAND: message`` and exits with the command's ``failure_exit`` (1 unless the
command says otherwise: 8 for fsck/dump/export). Exit codes are listed in docs/OPERATIONS.md.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = [
    "SUBCOMMAND_MODULES",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "build_parser",
    "main",
    "add_data_dir_argument",
    "add_store_argument",
    "data_dir_of",
    "store_url_of",
    "describe_error",
    "package_version",
]

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "tools.serve",  # logstore serve
    "tools.sites",  # logstore site add|list|remove|passwd
    "tools.fsck",  # logstore fsck
    "tools.dump",  # logstore dump|export
    "tools.erase",  # logstore conversation delete (site remove --purge is in tools.sites)
    "tools.backup",  # logstore backup|restore
    "tools.db",  # logstore db migrate|status (PostgreSQL stores)
    "tools.migrate",  # logstore migrate --from URL --to URL
)

EXIT_FAILURE = 1  # the operation failed (unknown site, port in use, data dir unusable, ...)
EXIT_USAGE = 2  # bad argument or setting (argparse uses 2 as well)
EXIT_INTERRUPTED = 130  # Ctrl-C


def default_data_dir() -> str:
    return os.environ.get("LOGSTORE_DATA_DIR", "./data")


def add_data_dir_argument(parser: argparse.ArgumentParser, *, default: bool = True) -> None:
    """The shared ``--data-dir`` option (default ``$LOGSTORE_DATA_DIR`` or ``./data``). With
    ``default=False`` the value stays None when not given (commands that also take a positional alias)."""
    parser.add_argument(
        "--data-dir",
        default=default_data_dir() if default else None,
        help="data directory (env LOGSTORE_DATA_DIR; default ./data)",
    )


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """``--store URL`` and ``--data-dir D`` (= ``--store file:D``), for commands that work on any store."""
    parser.add_argument(
        "--store", metavar="URL", help="store URL: file:DIR or postgresql://... (env LOGSTORE_STORE)"
    )
    add_data_dir_argument(parser, default=False)


def store_url_of(args: argparse.Namespace) -> str:
    """As ``serve``: ``--store``, else ``--data-dir`` given on the command line, else ``$LOGSTORE_STORE``,
    else ``file:`` + ``$LOGSTORE_DATA_DIR`` or ``./data``. Raises ValueError for a malformed URL."""
    from logstore.core.factory import file_url, parse_store_url

    url = args.store or (file_url(args.data_dir) if args.data_dir else None)
    url = url or os.environ.get("LOGSTORE_STORE") or file_url(default_data_dir())
    parse_store_url(url)
    return url


def data_dir_of(args: argparse.Namespace, positional: str | None) -> str:
    """The data dir from ``--data-dir``, the older positional form, or the environment/default.
    Raises ValueError when both forms are given and disagree."""
    option = args.data_dir
    if positional and option and os.path.abspath(positional) != os.path.abspath(option):
        raise ValueError(f"data dir given twice: {positional!r} and --data-dir {option!r}")
    return positional or option or default_data_dir()


def describe_error(exc: BaseException) -> str:
    """One line for an OSError (what failed, on which path) or any other error."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        hint = ""
        # The path says whose problem it is (data dir, destination, --out file): name it, never guess.
        if isinstance(exc, PermissionError) and exc.filename:
            hint = f" (can this user write to {os.path.dirname(os.path.abspath(exc.filename))}?)"
        elif isinstance(exc, NotADirectoryError | FileExistsError) and exc.filename:
            return f"not a directory: {exc.filename} (a file stands where a directory is needed)"
        return f"{exc.strerror}{where}{hint}"
    return str(exc) or type(exc).__name__


def package_version() -> str:
    from logstore.core.distribution import version

    return version("unknown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logstore",
        description="Durable, append-only conversation memory for AI agents: the MCP server and the "
        "operator tools. Exit codes: docs/OPERATIONS.md.",
    )
    parser.add_argument("--version", action="version", version=f"logstore {package_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        from logstore.core.errors import LogstoreError  # here: `logstore --help` must not load the engine

        if not isinstance(exc, OSError | LogstoreError):
            raise
        action = getattr(args, "site_command", None) or getattr(args, "conversation_command", None)
        name = f"{args.command} {action}" if action else args.command
        print(f"logstore {name}: {describe_error(exc)}", file=sys.stderr)
        return int(getattr(args, "failure_exit", EXIT_FAILURE))


if __name__ == "__main__":
    sys.exit(main())
