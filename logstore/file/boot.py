"""This machine's boot id: what tells a process crash (the page cache survived) from a power loss (it did
not). The manifest's sessions and the conversations' commit points both record it.

``boot_id`` is looked up through this module (``boot.boot_id()``), never imported by name, so the power-loss
simulator of the tests (``tests.faultfs.simulate_reboot``) can give the process a new boot.
"""

from __future__ import annotations

import uuid
from functools import cache

__all__ = ["boot_id"]


@cache
def boot_id() -> bytes:
    """This boot's id (16 bytes); all zeros where the kernel does not provide one (a boot id that never
    matches, so every unclosed session there counts as a power loss: the safe side)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return uuid.UUID(fh.read().strip()).bytes
    except (OSError, ValueError):
        return bytes(16)
