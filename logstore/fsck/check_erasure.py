"""fsck of what an erasure, or a lost log, leaves behind: an interrupted erasure and an index without its log.

An interrupted erasure (``<id>.erasing`` present, ``file.erasure``) is not data loss: the operator asked
for the conversation to go, and the crash left part of it. It is reported as ``erasure-interrupted``
(severity ``unfinished``, exit bit 16: "run the delete again, or ``fsck --repair``") instead of the
``missing-log``/``index-missing`` findings its half-removed files would otherwise give, and ``--repair``
finishes it (``erasure.finish_erasure``: under the conversation's lock, as the delete would; a log created
after the erasure committed is kept and only the marker goes).

An index without its log, and no erasure marker, is an error (``orphan-index``): the engine refuses to
append to a conversation whose index proves frames its (missing) log lacks (``Corrupted``, missing-frames),
so fsck must not call such a store clean. ``--repair`` moves the index aside, under the conversation's
lock, to ``<id>.idx.broken-<time>`` (the engine then starts the conversation afresh; the file is kept for
whoever investigates the lost log).
"""

from __future__ import annotations

import os

from ..core.errors import Timeout
from ..file import layout
from ..file.erasure import Finished, finish_erasure, marker_names_log
from ..file.layout import conversation_paths
from ..file.locking import held
from .check_log import broken_target
from .check_report import CheckContext

__all__ = ["note_marker", "settle_erasures", "orphan_index"]


def note_marker(ctx: CheckContext, site: str, cid: str) -> None:
    """Remember a conversation whose erasure marker was seen while walking the site."""
    ctx.erasing.setdefault(site, set()).add(cid)


def settle_erasures(ctx: CheckContext, site: str, plan: dict[str, int]) -> set[str]:
    """Report (and with repair, finish) the site's interrupted erasures before its logs and manifest are
    checked. Conversations being erased leave ``plan``; returns those still pending (their manifest
    entries may outlive their logs: not ``missing-log``)."""
    pending: set[str] = set()
    for cid in sorted(ctx.erasing.get(site, ())):
        paths = conversation_paths(ctx.data_dir, site, cid)
        marker = layout.erasure_marker_path(paths)
        names = marker_names_log(ctx.ops, paths)
        if names is None:  # finished meanwhile
            if not ctx.ops.exists(paths.log):
                plan.pop(cid, None)
            continue
        newer = names is False and ctx.ops.exists(paths.log)
        command = f"logstore conversation delete --site {site} {cid}"
        if not ctx.repair:
            if newer:
                message = (
                    "an erasure committed but left its marker; the log there now is a newer conversation "
                    "(--repair removes the marker)"
                )
            else:
                message = f"erasure of {site}/{cid} interrupted: run `{command}` again (or fsck --repair)"
                pending.add(cid)
                plan.pop(cid, None)
            ctx.found("erasure-interrupted", marker, message, site=site, conversation=cid)
            continue
        try:
            outcome = finish_erasure(ctx.data_dir, site, cid, file_ops=ctx.ops, lock_timeout=ctx.lock_timeout)
        except Timeout as exc:
            ctx.found("lock-timeout", paths.lock, f"{exc}: interrupted erasure not finished", site=site)
            pending.add(cid)
            plan.pop(cid, None)
            continue
        if outcome is Finished.MARKER_ONLY:
            note = "marker of a committed erasure removed; the newer conversation there is kept"
        else:
            note = f"erasure of {site}/{cid} was interrupted; finished (as `{command}` would)"
            plan.pop(cid, None)
        ctx.add_fixed("erasure-interrupted", marker, note, site=site, conversation=cid)
    return pending


def orphan_index(ctx: CheckContext, site: str, cid: str, path: str) -> None:
    """An index without its log (module docstring); with repair, moved aside under the lock."""
    message = (
        "index without its log: the engine refuses appends to this conversation (missing-frames) until "
        "the index is moved aside (--repair)"
    )
    if not ctx.repair:
        ctx.found("orphan-index", path, message, site=site, conversation=cid)
        return
    paths = conversation_paths(ctx.data_dir, site, cid)
    try:
        with held(paths.lock, ctx.lock_timeout):
            if ctx.ops.exists(paths.log) or not ctx.ops.exists(path):
                return  # the conversation came back (a writer) or the index went: nothing orphaned now
            target = broken_target(ctx.ops, path)
            ctx.ops.rename(path, target)
            ctx.ops.fsync_dir(os.path.dirname(path))
    except Timeout as exc:
        ctx.found("orphan-index", path, message, site=site, conversation=cid)
        ctx.found("lock-timeout", paths.lock, f"{exc}: orphan index not moved aside", site=site)
        return
    ctx.add_fixed(
        "orphan-index",
        path,
        message + f"; moved aside to {ctx.rel(target)}",
        site=site,
        conversation=cid,
        saved_to=ctx.rel(target),
    )
