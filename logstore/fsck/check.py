"""Verification and repair of a data dir (``logstore fsck``), in the style of diskcache's ``check(fix=...)``.

    from logstore.fsck.check import check
    report = check("/var/lib/logstore", repair=False)
    report.exit_code          # 0 clean | 1 all fixed | 4 errors left | 8 operational (OR-ed, as e2fsck)
    report.findings           # [Finding(kind, file, message, site, conversation, offset, seqs, fixed, ...)]
    report.summary()          # conversations, frames, items, bytes, elapsed, MB/s, counts

What is checked: every site and conversation (``check_log``: frames, seqs, timestamps, torn tail vs
corruption with the recovery scanner itself, the index in both directions), every site manifest against
the logs (``check_manifest``), and the files of the layout (``Store`` in store.py): anything in the wrong
place, unknown, or left over. It is safe beside running servers: each conversation is finished under its
own lock (the one appends take), a manifest rebuild under the manifest's compaction lock, and the whole
run holds the data dir lock shared (``file.data_dir_lock``), as a store does: a restore or a backup into
this data dir refuses meanwhile. A read-only data dir is checked (locks open read-only there).

What is repaired (``repair=True``): torn tails are cut (bytes saved first to ``<log>.broken-<time>``),
stale or wrong indexes rebuilt, the manifest rebuilt from the logs. Corruption inside acknowledged data is
cut only with ``truncate_corrupt=True``. Nothing else is ever removed: unknown and orphan files are
reported, never deleted. A second repair run finds nothing (exit 0).
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Iterator
from functools import partial

from ..core.errors import InvalidArgument, Timeout
from ..core.ids import is_valid_id, validate_conversation_id, validate_site
from ..file import layout
from ..file.data_dir_lock import DataDirLock
from ..file.fileio import OS_FILE_OPS, FileOps
from ..file.layout import conversation_paths
from ..file.manifest.codec import Entry
from .backup_manifest import verify as verify_backup
from .check_erasure import note_marker, orphan_index, settle_erasures
from .check_log import ConversationOutcome, check_conversation, current_entry
from .check_manifest import ManifestView, describe_mismatch, stray_findings
from .check_report import CheckContext, CheckReport, Finding, ProgressCallback, stray_kind
from .check_top import check_top_files

__all__ = ["check", "CheckReport", "Finding"]


def check(
    data_dir: str | os.PathLike[str],
    *,
    site: str | None = None,
    conversation: str | None = None,
    repair: bool = False,
    truncate_corrupt: bool = False,
    lock_timeout: float = 5.0,
    progress: ProgressCallback | None = None,
    file_ops: FileOps = OS_FILE_OPS,
) -> CheckReport:
    """Check (and repair) ``data_dir``, or one site, or one conversation (in ``site`` or in every site).

    Raises ``InvalidArgument`` for a data dir that does not exist or is not one, or a bad site name or
    conversation id; every other problem is a finding in the report."""
    root = os.path.abspath(os.fspath(data_dir))
    if not os.path.isdir(root):
        raise InvalidArgument(f"data dir {root} does not exist or is not a directory", field="data_dir")
    # A backup (its manifest, or its mark when the manifest is gone); an interrupted one may have no sites/
    is_backup = any(map(os.path.exists, (layout.backup_manifest_path(root), layout.backup_of_path(root))))
    if not os.path.isdir(layout.sites_dir(root)) and not is_backup:  # every Store creates it: a wrong path
        raise InvalidArgument(f"{root} is not a logstore data dir (no sites/ directory)", field="data_dir")
    if site is not None:
        validate_site(site)
    if conversation is not None:
        validate_conversation_id(conversation)
    if lock_timeout < 0:
        raise InvalidArgument(f"lock_timeout must be >= 0, got {lock_timeout!r}", field="lock_timeout")
    started = time.monotonic()
    report = CheckReport(root)
    ctx = CheckContext(
        file_ops,
        root,
        report,
        repair=repair or truncate_corrupt,
        truncate_corrupt=truncate_corrupt,
        lock_timeout=lock_timeout,
        progress=progress,
    )
    # Online: shared, as a store's (a restore into this data dir, or a backup into it, is not running).
    with DataDirLock.shared(file_ops, root, timeout=lock_timeout):
        _check_all(ctx, site, conversation, is_backup=is_backup)
    report.elapsed = time.monotonic() - started
    return report


def _check_all(ctx: CheckContext, site: str | None, conversation: str | None, *, is_backup: bool) -> None:
    report, root = ctx.report, ctx.data_dir
    filtered = site is not None or conversation is not None
    if not filtered:
        _check_top_level(ctx)
        check_top_files(ctx, is_backup=is_backup)
    plans = [(name, _plan_site(ctx, name, conversation)) for name in _sites(ctx, site, strays=not filtered)]
    ctx.total_bytes = sum(size for _, plan in plans for size in plan.values())
    for name, plan in plans:
        if conversation is not None and not plan:
            continue  # the conversation has no files in this site
        report.sites += 1
        _check_site(ctx, name, plan, whole_site=conversation is None)
    if not filtered and is_backup:
        for problem in verify_backup(ctx.ops, root):  # a backup: is it whole? (backup_manifest)
            ctx.found(
                problem.kind,
                problem.path,
                problem.message,
                site=problem.site,
                conversation=problem.conversation,
            )
    ctx.advance(0, force=True)


# ---------------------------------------------------------------------- layout
def _scandir(ctx: CheckContext, path: str) -> list[os.DirEntry[str]]:
    """Entries of ``path`` sorted by name; [] if it is gone; an unreadable directory is an io-error."""
    try:
        return sorted(ctx.ops.scandir(path), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        _unreadable(ctx, path, exc)
        return []


def _unreadable(ctx: CheckContext, path: str, exc: OSError) -> None:
    ctx.found("io-error", path, f"cannot list the directory: {exc.strerror or exc}")


def _sites(ctx: CheckContext, only: str | None, *, strays: bool) -> list[str]:
    def stray(path: str, _name: str) -> None:
        if strays:
            ctx.found("unknown-file", path, "not a site directory (left alone)")

    # The layout's directory rule (layout.iter_sites), so that fsck checks exactly the sites the other
    # walkers see; what it passes over is reported here.
    sites = layout.iter_sites(ctx.ops, ctx.data_dir, stray=stray, unreadable=partial(_unreadable, ctx))
    return [site for site in sites if only is None or site == only]


def _check_top_level(ctx: CheckContext) -> None:
    loose = _LooseModes(ctx, None)
    loose.see(ctx.data_dir)
    for entry in _scandir(ctx, ctx.data_dir):
        if entry.name not in layout.TOP_LEVEL:
            _stray(ctx, entry.path, entry.name, None)
        else:
            loose.see(entry.path)
    loose.report()


class _LooseModes:
    """Counts files and directories group/others may access; one warning per site (an old data dir
    would otherwise give one per file). Modes are not changed: that is the operator's call."""

    def __init__(self, ctx: CheckContext, site: str | None) -> None:
        self.ctx, self.site = ctx, site
        self.paths: list[str] = []

    def see(self, path: str, mode: int | None = None) -> None:
        if mode is None:
            try:
                mode = os.stat(path, follow_symlinks=False).st_mode
            except OSError:
                return
        if mode & 0o077:
            self.paths.append(path)

    def report(self) -> None:
        if self.paths:
            self.ctx.found(
                "loose-permissions",
                self.paths[0],
                f"{len(self.paths)} file(s) or directories can be accessed by other users (logstore "
                "creates files 0600 and directories 0700); fix with: chmod -R go-rwx "
                + shlex.quote(self.ctx.data_dir),
                site=self.site,
            )


def _stray(ctx: CheckContext, path: str, name: str, site: str | None) -> None:
    kind = stray_kind(name)
    if kind is not None:
        ctx.found(kind, path, "logstore does not write this file here (left alone)", site=site)


def _plan_site(ctx: CheckContext, site: str, only: str | None) -> dict[str, int]:
    """Conversations of a site to check, with their log sizes (for the progress total). Walking also
    reports files that do not belong; an index without its log is reported here (nothing to check)."""
    if only is not None:
        paths = conversation_paths(ctx.data_dir, site, only)
        size = ctx.ops.stat_size(paths.log)
        being_erased = ctx.ops.exists(layout.erasure_marker_path(paths))
        if being_erased:
            note_marker(ctx, site, only)
        elif size is None and ctx.ops.exists(paths.index):
            orphan_index(ctx, site, only, paths.index)
        return {} if size is None and not being_erased else {only: size or 0}
    site_dir = layout.site_dir(ctx.data_dir, site)
    for entry in _scandir(ctx, site_dir):
        if entry.name not in layout.SITE_ENTRIES:
            _stray(ctx, entry.path, entry.name, site)
    plan: dict[str, int] = {}
    for leaf, h1h2, files in _leaves(ctx, site):
        logs: dict[str, int] = {}
        indexes: set[str] = set()
        marked: set[str] = set()
        for name, size in files:
            base, dot, suffix = name.rpartition(".")
            if ".log.broken-" in name or ".idx.broken-" in name:
                ctx.report.broken_files += 1
            elif "." + suffix == layout.ERASING_SUFFIX and is_valid_id(base) and layout.fanout(base) == h1h2:
                marked.add(base)
                note_marker(ctx, site, base)
            elif dot and "." + suffix in layout.CONVERSATION_SUFFIXES and is_valid_id(base):
                home = layout.fanout(base)
                if home != h1h2 and suffix != "log":  # a stray index or lock holds no data
                    ctx.found(
                        "orphan-file",
                        os.path.join(leaf, name),
                        "in the wrong fan-out directory; holds no data (left alone)",
                        site=site,
                        conversation=base,
                    )
                elif home != h1h2:
                    ctx.found(
                        "misplaced-file",
                        os.path.join(leaf, name),
                        f"belongs in conversations/{'/'.join(home)}/: the engine never looks here",
                        site=site,
                        conversation=base,
                    )
                elif suffix == "log":
                    logs[base] = size
                elif suffix == "idx":
                    indexes.add(base)
            else:
                _stray(ctx, os.path.join(leaf, name), name, site)
        for cid in sorted(indexes - logs.keys() - marked):
            orphan_index(ctx, site, cid, os.path.join(leaf, cid + ".idx"))
        plan.update(logs)
    return plan


def _leaves(ctx: CheckContext, site: str) -> Iterator[tuple[str, tuple[str, str], list[tuple[str, int]]]]:
    """(leaf dir, (h1, h2), [(file name, size)]) for every fan-out leaf (the layout's directory rule,
    ``layout.iter_leaves``); anything else is reported."""
    loose = _LooseModes(ctx, site)
    root = layout.conversations_dir(ctx.data_dir, site)
    for path in (layout.site_dir(ctx.data_dir, site), root, layout.manifest_dir(ctx.data_dir, site)):
        loose.see(path)
    seen_h1 = None
    leaves = layout.iter_leaves(
        ctx.ops,
        ctx.data_dir,
        site,
        stray=lambda path, name: _stray(ctx, path, name, site),
        unreadable=partial(_unreadable, ctx),
    )
    for leaf in leaves:
        if leaf.fanout[0] != seen_h1:
            seen_h1 = leaf.fanout[0]
            loose.see(os.path.dirname(leaf.path))
        loose.see(leaf.path)
        files = []
        for f in leaf.entries:
            try:
                if f.is_file(follow_symlinks=False):
                    st = f.stat(follow_symlinks=False)
                    loose.see(f.path, st.st_mode)
                    files.append((f.name, st.st_size))
                    continue
            except FileNotFoundError:  # removed meanwhile (a temp file renamed into place)
                continue
            _stray(ctx, f.path, f.name, site)
        yield leaf.path, leaf.fanout, files
    loose.report()


# ---------------------------------------------------------------------- per site
def _check_site(ctx: CheckContext, site: str, plan: dict[str, int], *, whole_site: bool) -> None:
    erasing = settle_erasures(ctx, site, plan)  # first: a finished erasure is in the manifest loaded next
    mdir = layout.manifest_dir(ctx.data_dir, site)
    loaded = ManifestView(ctx, site)
    view: ManifestView | None = loaded
    try:
        loaded.load()
    except OSError as exc:  # still check the logs; there is just nothing to compare them with
        ctx.found("io-error", mdir, f"cannot read the manifest: {exc.strerror or exc}", site=site)
        view = None
    stale: dict[str, tuple[Finding, Entry]] = {}
    checked: dict[str, Entry] = {}
    unchecked: set[str] = set()

    for cid in sorted(plan):

        def compare(outcome: ConversationOutcome, cid: str = cid) -> None:
            # Under the conversation lock: a writer's manifest record for every append it finished is
            # in the journal by now, so a second look settles any race with it.
            if view is None or outcome.entry is None:
                return
            problem = _mismatch(view.entries.get(cid), outcome.entry, outcome.corrupt)
            if problem is not None:
                view.refresh()
                problem = _mismatch(view.entries.get(cid), outcome.entry, outcome.corrupt)
            if problem is not None:
                finding = ctx.found("manifest-stale", mdir, problem, site=site, conversation=cid)
                stale[cid] = (finding, outcome.entry)

        outcome = check_conversation(ctx, site, cid, conversation_paths(ctx.data_dir, site, cid), compare)
        ctx.report.conversations += 1
        if outcome.checked and outcome.entry is not None:
            checked[cid] = outcome.entry
        else:
            unchecked.add(cid)
    if view is not None:
        _check_manifest(ctx, view, plan, stale, checked, unchecked | erasing, whole_site=whole_site)


def _check_manifest(
    ctx: CheckContext,
    view: ManifestView,
    plan: dict[str, int],
    stale: dict[str, tuple[Finding, Entry]],
    checked: dict[str, Entry],
    unchecked: set[str],
    *,
    whole_site: bool,
) -> None:
    """Site-level manifest findings (damage, lost logs, strays), then its repair."""
    site = view.site
    problems = [finding for finding, _ in stale.values()]
    for path, offset, message in view.damage:
        problems.append(ctx.found("manifest-damaged", path, message, site=site, offset=offset))
    if whole_site:
        for cid, entry in sorted(view.entries.items()):
            log_path = conversation_paths(ctx.data_dir, site, cid).log
            if cid in plan or cid in unchecked or entry.next_seq == 0 or ctx.ops.exists(log_path):
                continue  # listed and checked, being erased, never appended to, or created meanwhile
            problems.append(
                ctx.found(
                    "missing-log",
                    log_path,
                    f"the manifest lists {entry.next_seq} item(s) but the log is gone: they are lost",
                    site=site,
                    conversation=cid,
                    seqs=(0, entry.next_seq - 1),
                )
            )
        for finding in stray_findings(view):
            ctx.add(finding)
    if not ctx.repair or not problems:
        return

    def current(cid: str, known: Entry | None) -> Entry | None:
        return current_entry(ctx, conversation_paths(ctx.data_dir, site, cid), known)

    try:
        if whole_site:
            view.rebuild(checked, current, unchecked)
            for finding in problems:
                fixed = finding.kind != "missing-log"  # the listing is right again; the data is not
                ctx.amend(finding, fixed=fixed, note="; manifest rebuilt from the logs" if fixed else "")
        else:
            _fix_entries(ctx, view, stale, current)
    except Timeout as exc:
        ctx.found("lock-timeout", view.directory, f"{exc}: manifest not repaired", site=site)
    except OSError as exc:
        ctx.found("io-error", view.directory, f"manifest repair failed: {exc.strerror or exc}", site=site)


def _mismatch(stored: Entry | None, derived: Entry, corrupt: bool) -> str | None:
    if corrupt:  # a corrupt log's state is uncertain: only its presence in the manifest is checked
        return None if stored is not None else describe_mismatch(None, derived)
    return describe_mismatch(stored, derived)


def _fix_entries(
    ctx: CheckContext,
    view: ManifestView,
    stale: dict[str, tuple[Finding, Entry]],
    current: Callable[[str, Entry | None], Entry | None],
) -> None:
    """Repair of one conversation's manifest entry (``--conversation``): append a newer record. A record
    cannot lower what the manifest claims (records merge by max, e.g. after ``--truncate-corrupt`` cut the
    log): then the manifest is rebuilt with that entry replaced and every other entry kept as recorded,
    so one run leaves the store consistent without reading the site's other logs."""
    fixes: dict[str, Entry] = {}
    lowered: dict[str, Entry] = {}
    for cid, (_, derived) in stale.items():
        stored = view.entries.get(cid)
        (fixes if stored is None or derived.newer_than(stored) else lowered)[cid] = derived
    if fixes:
        view.append_records(fixes)
    if lowered:
        view.rebuild(lowered, current, set(view.entries) - set(lowered))
    for cid, (finding, _) in stale.items():
        note = (
            "; manifest rebuilt with the corrected entry"
            if cid in lowered
            else "; corrected record appended to the manifest journal"
        )
        ctx.amend(finding, fixed=True, note=note)
