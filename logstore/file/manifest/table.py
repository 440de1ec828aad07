"""A site manifest's state in memory: the packed snapshot it loaded (``snapshot.Snapshot``) plus
an overlay of the conversations changed since (journal records, this process's commits). Pure, no I/O.

Why packed: a dict of objects and a sorted list of tuples per conversation took several times the memory
of the snapshot's columns (figures: docs/PERFORMANCE.md, "Manifest compaction at scale"), and the overlay
only holds what the journals changed (bounded by compaction: a new snapshot becomes the new base,
``SiteManifest.rebase``).

Listing merges the base (already in listing order, skipping conversations the overlay replaced) with the
overlay's own sorted keys: a page is O(log n + limit + skipped), where skipped base entries are those the
overlay replaced and that sort between the cursor and the page's end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sortedcontainers import SortedList

from .codec import ERASED, Entry, Session, erased_entry, merged
from .snapshot import EMPTY, Snapshot, listing_key, merge_snapshot

__all__ = ["ManifestTable"]

_GONE = erased_entry()  # overlay value of a conversation the base has but that was erased since


class ManifestTable:
    def __init__(self, base: Snapshot = EMPTY) -> None:
        self.base = base
        self._over: dict[str, Entry] = {}
        self._order: SortedList = SortedList()  # listing keys of the overlay's listed entries, as of
        # the last page; ``_stale`` holds what changed since: cid -> the key ``_order`` still has for it
        # (None: none). Brought up to date by ``_ordered`` when a page is read, so a conversation that
        # takes many commits between two listings costs one dict write per commit, not a SortedList
        # remove + insert (figures: docs/PERFORMANCE.md, "Manifest compaction at scale"; the listing order
        # is the same).
        self._stale: dict[str, tuple[int, str] | None] = {}

    def get(self, conversation_id: str) -> Entry | None:
        entry = self._over.get(conversation_id)
        if entry is not None:
            return None if entry.created_at == ERASED else entry
        return self.base.get(conversation_id)

    def apply(self, conversation_id: str, record: Entry) -> bool:
        """Apply one record by the merge rule (``codec.merged``); True if the state changed."""
        # A commit's plain advance, the overlay's entry already marked stale: ``merged`` would return
        # ``record`` itself (the same created_at, >= 0: neither an erasure nor a created_at to keep; a
        # higher next_seq: newer) and ``_set`` would only store it. Four Python calls less per commit
        # (figures: docs/PERFORMANCE.md; tests/test_manifest_codec.py holds it to ``merged``).
        current = self._over.get(conversation_id)
        if (
            current is not None
            and record.next_seq > current.next_seq
            and record.created_at == current.created_at >= 0
            and conversation_id in self._stale
        ):
            self._over[conversation_id] = record
            return True
        current = self.get(conversation_id)
        new = merged(current, record)
        if new is current:
            return False
        self._set(conversation_id, current, new)
        return True

    def force(self, conversation_id: str, entry: Entry) -> None:
        """Replace whatever is known (reconciliation found the log says otherwise)."""
        self._set(conversation_id, self.get(conversation_id), entry)

    def _set(self, cid: str, current: Entry | None, new: Entry | None) -> None:
        if cid not in self._stale:  # the first change since the last page: remember what _order holds
            held = None
            if current is not None and current.next_seq > 0 and cid in self._over:
                held = listing_key(cid, current)
            self._stale[cid] = held
        if new is None:
            if self.base.find(cid) is None:
                self._over.pop(cid, None)
            else:
                self._over[cid] = _GONE
            return
        self._over[cid] = new

    def _ordered(self) -> SortedList:
        """``_order`` with every change since the last page applied: each stale key out, the overlay's
        current key (if it is listed) in."""
        if self._stale:
            order, over = self._order, self._over
            for cid, old in self._stale.items():
                if old is not None:
                    order.remove(old)  # remove, not discard: a key missing here is a bug, not a no-op
                entry = over.get(cid)
                if entry is not None and entry.created_at != ERASED and entry.next_seq > 0:
                    order.add(listing_key(cid, entry))
            self._stale.clear()
        return self._order

    def added(self) -> list[str]:
        """Conversations known but not in the base (created or first seen since it was written)."""
        find = self.base.find
        return [cid for cid, e in self._over.items() if e.created_at != ERASED and find(cid) is None]

    def __len__(self) -> int:
        base, over = self.base, self._over
        shadowed = sum(1 for cid in over if base.find(cid) is not None)
        return base.count - shadowed + sum(1 for e in over.values() if e.created_at != ERASED)

    def items(self) -> Iterator[tuple[str, Entry]]:
        """Every known conversation (listed or not) and its entry."""
        over = self._over
        for cid, entry in self.base.items():
            if cid not in over:
                yield cid, entry
        for cid, entry in over.items():
            if entry.created_at != ERASED:
                yield cid, entry

    def packed(self, sessions: Iterable[Session]) -> bytes:
        """This state as a snapshot file: the base's bytes copied with the overlay merged in
        (``snapshot.merge_snapshot``), not every entry sorted and encoded again."""
        changes = ((cid, None if e.created_at == ERASED else e) for cid, e in self._over.items())
        return merge_snapshot(self.base, changes, sessions)

    def page(self, after: tuple[int, str] | None, limit: int) -> tuple[list[tuple[str, int, int]], bool]:
        """Up to ``limit`` listed conversations whose key sorts after ``after`` (None: from the top), in
        listing order, as (id, created_at, last_appended_at), and whether more follow."""
        base, over = self.base, self._over
        i = 0 if after is None else base.first_listed_after(after)
        order = self._ordered()
        j = 0 if after is None else order.bisect_right(after)
        theirs = order.islice(j)
        other = next(theirs, None)
        out: list[tuple[str, int, int]] = []
        listed, last, created, id_at = base.listed, base.last, base.created, base.id_at
        mine: tuple[int, str] | None = None
        while len(out) <= limit:
            if mine is None:  # the next base entry the overlay did not replace
                while i < listed:
                    cid = id_at(i)
                    if cid not in over:
                        mine = (-last[i], cid)
                        break
                    i += 1
            if mine is None and other is None:
                break
            if other is None or (mine is not None and mine < other):
                assert mine is not None
                out.append((mine[1], created[i], -mine[0]))
                i += 1
                mine = None
            else:
                entry = over[other[1]]
                out.append((other[1], entry.created_at, entry.last_appended_at))
                other = next(theirs, None)
        return out[:limit], len(out) > limit
