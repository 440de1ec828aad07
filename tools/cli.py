"""``logstore`` console script: a thin argparse front over the subcommand modules.

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed namespace, returning an exit code). Adding a subcommand is one line in
``SUBCOMMAND_MODULES``; modules are imported only to register, and keep heavy imports inside ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["SUBCOMMAND_MODULES", "build_parser", "main", "add_data_dir_argument"]

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "tools.serve",  # logstore serve
    "tools.sites",  # logstore site add|list|remove|passwd
    "tools.fsck",  # logstore fsck|dump|export
)


def add_data_dir_argument(parser: argparse.ArgumentParser) -> None:
    """The shared ``--data-dir`` option (default ``$LOGSTORE_DATA_DIR`` or ``./data``)."""
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("LOGSTORE_DATA_DIR", "./data"),
        help="data directory (env LOGSTORE_DATA_DIR; default ./data)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logstore", description="Durable, append-only conversation memory for AI agents."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
