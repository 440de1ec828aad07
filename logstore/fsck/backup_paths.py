"""Where a backup may write: the one rule that keeps ``logstore backup``/``restore`` off its own source.

Path strings prove nothing: ``link -> data``, a bind mount of the data dir, ``backup/../data`` or a parent of
the data dir all name the source (or contain it) under another spelling, and a copy into any of them
overwrites or deletes acknowledged data. So before anything is written:

1. both paths are resolved (``realpath``: symlinks, ``..``; a destination that does not exist yet is
   resolved up to its deepest existing ancestor), and the resolved spelling is the one used from then on;
2. directories are compared by identity (device, inode), never by name: the destination is refused when
   any existing ancestor of it (itself included) *is* the source or a directory inside the source (a
   bind mount of ``data/sites`` has the inode of ``data/sites``), and when the destination *is* the source
   or any ancestor of it (a parent of the data dir, however spelled).

The walk of the source's directories (step 2, first half) is needed only when the destination is on the
same device as the source; a backup on another file system costs one ``stat`` per ancestor.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from ..core.errors import InvalidArgument

__all__ = ["BackupPaths", "resolve_backup_paths", "links_in", "refuse_links"]

_Id = tuple[int, int]


@dataclass(frozen=True, slots=True)
class BackupPaths:
    source: str  # resolved, existing
    dest: str  # resolved (may not exist yet)


def resolve_backup_paths(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> BackupPaths:
    """The resolved (source, dest) pair, or ``InvalidArgument`` when one contains the other, however
    spelled (module docstring). Reads only: nothing is created or changed."""
    src = os.path.realpath(os.fspath(source))
    dst = os.path.realpath(os.fspath(dest))
    try:
        src_id = _ident(src)
    except OSError as exc:
        raise InvalidArgument(f"cannot read the source {src}: {exc.strerror or exc}", field="source") from exc
    dest_chain = dict(_existing_ancestors(dst))  # id -> path, the destination itself first if it exists
    refusal = (
        f"the backup {os.fspath(dest)!r} (resolved: {dst}) and the data dir {os.fspath(source)!r} "
        f"(resolved: {src}) must be outside each other"
    )
    if src_id in dest_chain:
        raise InvalidArgument(f"{refusal}: the destination is the data dir or inside it", field="dest")
    if any(dev == src_id[0] for dev, _ in dest_chain):
        for inner in _directories_under(src):
            if inner in dest_chain:
                raise InvalidArgument(
                    f"{refusal}: {dest_chain[inner]} is a directory of the data dir (a bind mount or "
                    "another name for it)",
                    field="dest",
                )
    if os.path.lexists(dst):
        try:
            dst_id = _ident(dst)
        except OSError as exc:
            raise InvalidArgument(f"cannot read the destination {dst}: {exc.strerror or exc}") from exc
        if dst_id in dict(_existing_ancestors(src)):
            raise InvalidArgument(f"{refusal}: the destination holds the data dir", field="dest")
    return BackupPaths(src, dst)


def _ident(path: str) -> _Id:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _existing_ancestors(path: str) -> Iterator[tuple[_Id, str]]:
    """(identity, path) of ``path`` (if it exists) and of every existing directory above it."""
    while True:
        try:
            yield _ident(path), path
        except OSError:
            pass
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _entries_below(
    root: str, *, skip: type[OSError] | tuple[type[OSError], ...]
) -> Iterator[os.DirEntry[str]]:
    """Every entry below ``root``, depth first, symlinks not followed (they are not part of it); a
    directory that cannot be listed with ``skip`` (its class or a subclass) is passed over."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except skip:
            continue
        for entry in entries:
            yield entry
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
            except skip:
                continue


def _directories_under(root: str) -> Iterator[_Id]:
    """Identity of every directory below ``root`` (symlinks not followed: they are not part of it)."""
    for entry in _entries_below(root, skip=OSError):
        try:
            if entry.is_dir(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                yield st.st_dev, st.st_ino
        except OSError:
            continue


def links_in(root: str) -> list[str]:
    """Every symbolic link below ``root`` (not followed). A backup, a restore's source and its target must
    hold none: ``DEST/sites -> <data dir>/sites`` would make a backup write into its own source, and a log
    that is a symlink would restore whatever file it names. A directory that cannot be read is an error
    (a link there would go unseen); one removed meanwhile is not."""
    return sorted(e.path for e in _entries_below(root, skip=FileNotFoundError) if e.is_symlink())


def refuse_links(root: str, other: str, *, field: str) -> None:
    """``InvalidArgument`` when the directory a backup or restore writes into (``root``, resolved) holds a
    symbolic link (``links_in``), or a file that is a hard link to the same file of ``other`` (the source:
    ``cp -al`` of a data dir). Other hard links (a ``cp -al`` rotation of backups) are allowed: a copy with
    another name is never written in place (``backup._write_log``). One ``lstat`` per file."""
    links = links_in(root)
    if links:
        shown = ", ".join(links[:3]) + (f" and {len(links) - 3} more" if len(links) > 3 else "")
        raise InvalidArgument(
            f"{root} holds symbolic links ({shown}): a backup or restore never writes through one (it could "
            "name the source); remove them. Nothing was written",
            field=field,
        )
    for entry in _entries_below(root, skip=(FileNotFoundError, NotADirectoryError)):
        if entry.is_dir(follow_symlinks=False):
            continue
        st = entry.stat(follow_symlinks=False)
        if st.st_nlink < 2:
            continue
        twin = os.path.join(other, os.path.relpath(entry.path, root))
        try:
            theirs = os.lstat(twin)
        except OSError:
            continue
        if (theirs.st_dev, theirs.st_ino) == (st.st_dev, st.st_ino):
            raise InvalidArgument(
                f"{entry.path} is a hard link to {twin}: writing there would change the other one. "
                "Nothing was written; use a new directory",
                field=field,
            )
