"""The installable distribution's name and version, in one place.

The import name is ``logstore``; the distribution is ``logstore-memory``, because ``logstore`` on the package
index is an unrelated project (issue 36 §4). Until it is published, install from a clone
(``pip install -e '.[postgres]'``) or a git URL (``pip install 'logstore-memory[postgres] @ git+URL'``).
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["DISTRIBUTION", "version"]

DISTRIBUTION = "logstore-memory"


def version(default: str) -> str:
    """The installed distribution's version, or ``default`` when running from a bare checkout."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return default
