"""``logstore site add|list|remove|passwd``: manage the sites (Basic-auth users) of a data dir.

``site add`` prints the password alone on the last line of stdout, so scripts can take ``| tail -n1``.
Removing a site revokes its credentials only; its stored conversations stay on disk (and become reachable
again if a site of the same name is added later).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register", "read_password_stdin"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from .cli import add_data_dir_argument

    site = subparsers.add_parser("site", help="manage sites (one site = one Basic-auth user and its data)")
    actions = site.add_subparsers(dest="site_command", metavar="ACTION", required=True)

    add = actions.add_parser("add", help="create a site; prints its password on the last line")
    add.add_argument("name", help="site name: 1-64 characters from [A-Za-z0-9_-]")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add_data_dir_argument(add)
    add.set_defaults(func=cmd_add)

    ls = actions.add_parser("list", help="list sites, one per line")
    add_data_dir_argument(ls)
    ls.set_defaults(func=cmd_list)

    rm = actions.add_parser("remove", help="revoke a site's credentials (its data stays on disk)")
    rm.add_argument("name")
    add_data_dir_argument(rm)
    rm.set_defaults(func=cmd_remove)

    pw = actions.add_parser("passwd", help="set a new password for a site; prints it on the last line")
    pw.add_argument("name")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add_data_dir_argument(pw)
    pw.set_defaults(func=cmd_passwd)


def read_password_stdin() -> str:
    password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise ValueError("empty password on stdin")
    return password


def _password(args: argparse.Namespace) -> tuple[str, bool]:
    """(password, generated?)"""
    from server.credentials import generate_password

    return (read_password_stdin(), False) if args.password_stdin else (generate_password(), True)


def cmd_add(args: argparse.Namespace) -> int:
    from logstore.errors import InvalidArgument
    from server.credentials import CredentialsFile, SiteExists

    creds = CredentialsFile(args.data_dir)
    try:
        password, generated = _password(args)
        creds.add(args.name, password)
    except (InvalidArgument, ValueError) as exc:
        print(f"logstore site add: {exc}", file=sys.stderr)
        return 2
    except SiteExists:
        print(f"logstore site add: site '{args.name}' already exists (use 'site passwd')", file=sys.stderr)
        return 1
    print(f"created site '{args.name}' in {creds.data_dir}")
    if generated:
        print(password)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from server.credentials import CredentialsFile

    for name in CredentialsFile(args.data_dir).sites():
        print(name)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from server.credentials import CredentialsFile, UnknownSite

    try:
        CredentialsFile(args.data_dir).remove(args.name)
    except UnknownSite:
        print(f"logstore site remove: no site '{args.name}'", file=sys.stderr)
        return 1
    print(f"removed site '{args.name}' (its credentials are revoked; its data stays on disk)")
    return 0


def cmd_passwd(args: argparse.Namespace) -> int:
    from server.credentials import CredentialsFile, UnknownSite

    try:
        password, generated = _password(args)
        CredentialsFile(args.data_dir).set_password(args.name, password)
    except ValueError as exc:
        print(f"logstore site passwd: {exc}", file=sys.stderr)
        return 2
    except UnknownSite:
        print(f"logstore site passwd: no site '{args.name}'", file=sys.stderr)
        return 1
    print(f"new password set for site '{args.name}'")
    if generated:
        print(password)
    return 0
