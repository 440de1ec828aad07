"""``logstore site add|list|remove|passwd``: manage the sites (Basic-auth users) of a store: a data dir
(``--data-dir D`` or ``--store file:D``) or a PostgreSQL database (``--store postgresql://...``; env
``LOGSTORE_STORE``), through its ``SiteRegistry`` (``logstore.core.factory.open_registry``).

``site add`` prints the password alone on the last line of stdout, so scripts can take ``| tail -n1``.
Removing a site revokes its credentials only; its stored conversations stay on disk (and become reachable
again if a site of the same name is added later) unless ``--purge`` erases them too (logstore.file.erasure,
logstore.postgres.erasure).

Exit codes: 0 done, 1 failed (site exists / unknown, data dir missing or unusable), 2 bad argument.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logstore.core.registry import SiteRegistry

__all__ = ["register", "read_password_stdin"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from .cli import add_store_argument

    site = subparsers.add_parser(
        "site",
        help="manage sites (one site = one Basic-auth user and its data)",
        description="Manage the sites of a data dir: each site is one HTTP Basic user and its own "
        "conversations. Running servers pick up changes within a second.",
    )
    actions = site.add_subparsers(dest="site_command", metavar="ACTION", required=True)

    add = actions.add_parser(
        "add",
        help="create a site; prints its password on the last line",
        description="Create a site. Its password is generated (printed alone on the last line of "
        "stdout) or read from stdin with --password-stdin; it is stored scrypt-hashed. Creates the data "
        "dir if needed. Exit: 0 created, 1 exists, 2 bad name or empty password.",
    )
    add.add_argument("name", help="site name: 1-64 characters from [A-Za-z0-9_-]")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add_store_argument(add)
    add.set_defaults(func=cmd_add)

    ls = actions.add_parser(
        "list",
        help="list sites, one per line",
        description="List the sites of a data dir, one per line (or --json). Exit: 0, or 1 if the data "
        "dir does not exist.",
    )
    ls.add_argument("--json", action="store_true", help='print {"sites": [...]}')
    add_store_argument(ls)
    ls.set_defaults(func=cmd_list)

    rm = actions.add_parser(
        "remove",
        help="revoke a site's credentials (--purge: and erase all its data)",
        description="Revoke a site's credentials. Its conversations stay on disk unless --purge is given: "
        "then the credentials are revoked, the command waits --grace seconds for running servers to "
        "notice (also when they were already revoked: a purge run again after an interruption), erases "
        "the site's conversations one by one (each crash-safe, under its lock), and deletes what is left "
        "of the site's directory, unlinking each lock file while holding it (docs/OPERATIONS.md, "
        "Erasure). Not atomic: if it is interrupted, or a log appears meanwhile, run it again. Exit: 0 "
        "done, 1 unknown site or failure, 2 bad name or --grace.",
    )
    rm.add_argument("name")
    rm.add_argument("--purge", action="store_true", help="also erase every conversation of the site")
    rm.add_argument(
        "--grace",
        type=float,
        default=2.0,
        help="with --purge: seconds (>= 0) to wait after revoking, for running servers to stop admitting "
        "the site (they re-read credentials within 1 s; default 2)",
    )
    add_store_argument(rm)
    rm.set_defaults(func=cmd_remove)

    pw = actions.add_parser(
        "passwd",
        help="set a new password for a site; prints it on the last line",
        description="Set a new password for a site (generated, or --password-stdin); the old one stops "
        "working on running servers within a second. Exit: 0, 1 unknown site, 2 empty password.",
    )
    pw.add_argument("name")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add_store_argument(pw)
    pw.set_defaults(func=cmd_passwd)


def read_password_stdin() -> str:
    password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise ValueError("empty password on stdin")
    return password


def _password(args: argparse.Namespace) -> tuple[str, bool]:
    """(password, generated?)"""
    from logstore.core.registry import generate_password

    return (read_password_stdin(), False) if args.password_stdin else (generate_password(), True)


def _registry(args: argparse.Namespace) -> tuple[SiteRegistry, str | None]:
    """The store's registry and, for a file store, its data dir. ValueError: a malformed URL."""
    from logstore.core.factory import open_registry, parse_store_url

    from .cli import store_url_of

    url = store_url_of(args)
    scheme, rest = parse_store_url(url)
    if scheme == "file" and os.path.exists(rest) and not os.path.isdir(rest):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", rest)  # exit 1, one line (cli)
    return open_registry(url), (os.path.abspath(rest) if scheme == "file" else None)


def _usage(action: str, exc: object) -> int:
    print(f"logstore site {action}: {exc}", file=sys.stderr)
    return 2


def cmd_add(args: argparse.Namespace) -> int:
    from logstore.core.errors import InvalidArgument
    from logstore.core.registry import SiteExists

    try:
        registry, data_dir = _registry(args)
        password, generated = _password(args)
        registry.add(args.name, password)
    except (InvalidArgument, ValueError) as exc:
        return _usage("add", exc)
    except SiteExists:
        print(f"logstore site add: site '{args.name}' already exists (use 'site passwd')", file=sys.stderr)
        return 1
    print(f"created site '{args.name}' in {data_dir or registry.location}")
    if generated:
        print(password)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    try:
        registry, data_dir = _registry(args)
    except ValueError as exc:
        return _usage("list", exc)
    if data_dir is not None and not os.path.isdir(data_dir):
        print(f"logstore site list: no data dir at {data_dir} (or it is not a directory)", file=sys.stderr)
        return 1
    sites = registry.sites()
    if args.json:
        where = {"data_dir": data_dir} if data_dir is not None else {"store": registry.location}
        print(json.dumps({**where, "sites": sites}))
    else:
        for name in sites:
            print(name)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    import time

    from logstore.core.errors import InvalidArgument
    from logstore.core.ids import validate_site
    from logstore.core.registry import UnknownSite

    try:
        validate_site(args.name)  # before anything changes (a purge would fail only after revoking)
        if not args.grace >= 0:  # (NaN too)
            raise ValueError(f"--grace must be a number of seconds >= 0, got {args.grace:g}")
        registry, data_dir = _registry(args)
    except (InvalidArgument, ValueError) as exc:
        return _usage("remove", exc)
    try:
        registry.remove(args.name)
    except UnknownSite:
        if not args.purge:
            print(f"logstore site remove: no site '{args.name}'", file=sys.stderr)
            return 1
        revoked = False  # already revoked (e.g. an interrupted purge): finish erasing its data
    else:
        revoked = True
    if not args.purge:
        print(f"removed site '{args.name}' (its credentials are revoked; its data stays in the store)")
        return 0
    if args.grace > 0:  # also when already revoked: a purge interrupted in its wait, run again
        time.sleep(args.grace)
    erased = _purge(args, data_dir)
    if not revoked and not erased:
        print(f"logstore site remove: no site '{args.name}' and no data for it", file=sys.stderr)
        return 1
    print(f"removed site '{args.name}': credentials revoked, {erased} conversation(s) erased")
    return 0


def _purge(args: argparse.Namespace, data_dir: str | None) -> int:
    """Erase every conversation of the site: a data dir's files, or a PostgreSQL store's rows."""
    if data_dir is not None:
        from logstore.file.data_dir_lock import DataDirLock
        from logstore.file.erasure import purge_site
        from logstore.file.fileio import OS_FILE_OPS

        # Online, as a store: shared (a restore into this data dir is not running, nor starts).
        with DataDirLock.shared(OS_FILE_OPS, os.path.abspath(data_dir), timeout=5.0):
            return purge_site(data_dir, args.name)
    from logstore.postgres.erasure import purge_site as purge_rows

    from .cli import store_url_of

    return purge_rows(store_url_of(args), args.name)


def cmd_passwd(args: argparse.Namespace) -> int:
    from logstore.core.registry import UnknownSite

    try:
        registry, _ = _registry(args)
        password, generated = _password(args)
        registry.set_password(args.name, password)
    except ValueError as exc:
        return _usage("passwd", exc)
    except UnknownSite:
        print(f"logstore site passwd: no site '{args.name}'", file=sys.stderr)
        return 1
    print(f"new password set for site '{args.name}'")
    if generated:
        print(password)
    return 0
