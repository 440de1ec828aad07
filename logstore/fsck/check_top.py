"""fsck of a data dir's top-level files: ``credentials.json``, ``secret`` and ``store_id``.

A malformed ``credentials.json`` makes every server refuse every client; a missing or short ``secret``
is replaced by the next process that opens the store, so list cursors issued before stop working (and
servers already running keep the old key: workers then disagree). Neither was looked at before.

- ``credentials-damaged`` (error): not a credentials file this build reads, or an entry that is not a
  site name with an object. Never rewritten by repair (it holds password hashes): restore it from a backup
  or recreate the sites (``logstore site add``).
- ``secret-damaged`` (error): missing, or not 32 bytes. Repair writes a new random secret (atomically);
  list cursors issued before are then refused, and running servers must be restarted to use it.
- ``store-id-damaged`` (error): ``store_id`` does not hold an id. Not repaired: backups of this store name
  it (``fsck.backup_manifest``); restore it from a backup, or remove it (a new id is made; backup
  destinations holding the old one are then refused as another store's).
"""

from __future__ import annotations

import secrets

from ..core.ids import is_valid_site
from ..file import layout
from ..file.credentials import CredentialsFile
from ..file.store_id import StoreIdDamaged, read_store_id
from .check_report import CheckContext

__all__ = ["check_top_files", "SECRET_SIZE"]

SECRET_SIZE = 32


def check_top_files(ctx: CheckContext, *, is_backup: bool) -> None:
    _check_credentials(ctx)
    _check_secret(ctx, is_backup=is_backup)
    try:
        read_store_id(ctx.ops, ctx.data_dir)
    except StoreIdDamaged as exc:
        ctx.found("store-id-damaged", layout.store_id_path(ctx.data_dir), str(exc))


def _check_credentials(ctx: CheckContext) -> None:
    path = layout.credentials_path(ctx.data_dir)
    try:
        sites = CredentialsFile(ctx.data_dir).load()
        bad = [
            name for name, entry in sites.items() if not is_valid_site(name) or not isinstance(entry, dict)
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSONDecodeError is a ValueError
        problem = f"{exc.__class__.__name__}: {exc}"
    except OSError as exc:
        ctx.found("io-error", path, f"cannot read: {exc.strerror or exc}")
        return
    else:
        if not bad:
            return
        problem = f"entries that are not a site name with its password hash: {', '.join(map(repr, bad[:5]))}"
    ctx.found(
        "credentials-damaged",
        path,
        f"{problem}; servers refuse every client. Not repaired (it holds password hashes): restore it from "
        "a backup or recreate the sites with `logstore site add`",
    )


def _check_secret(ctx: CheckContext, *, is_backup: bool) -> None:
    path = layout.secret_path(ctx.data_dir)
    try:
        key = ctx.ops.read_file(path)
    except OSError as exc:
        ctx.found("io-error", path, f"cannot read: {exc.strerror or exc}")
        return
    if key is not None and len(key) == SECRET_SIZE:
        return
    if key is None and is_backup:
        return  # an interrupted backup may not have copied it yet (backup-incomplete says so)
    state = "missing" if key is None else f"{len(key)} bytes, not {SECRET_SIZE}"
    message = (
        f"the key that signs list cursors is {state}: the next server makes a new one and every cursor "
        "issued before is refused"
    )
    if not ctx.repair:
        ctx.found("secret-damaged", path, message)
        return
    ctx.ops.atomic_write(path, secrets.token_bytes(SECRET_SIZE))
    ctx.add_fixed("secret-damaged", path, message + "; new secret written (restart the servers)")
