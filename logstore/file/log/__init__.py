"""The log: one conversation's durable record of batches, and everything that reads or writes it.

Owns the on-disk log format (``frame``: one CRC32C-checked frame per batch; ``index_codec``: the sidecar
seq index entries), the one scanner every reader uses (``scanner``), THE acknowledged-end rule and the
immutable ``LogState`` (``recovery``), the commit point readers trust across processes (``commit_point``),
group commit (``group_commit``), writing a group's frames (``writer``), the v2 preallocated tail
(``tail``), whether the log changed (``freshness``: one decision table), reads (``reads``), the sidecar
index (``seq_index``), and the conversation built on them by composition (``files``: a log's
descriptors, generation and published state, and every operation on them; ``conversation``: the
protocol over one ``LogFiles``: locks, group commit, settling, reads). Imports
``logstore.core`` and the file engine's base modules (``fileio``, ``statx``, ``locking``, ``boot``,
``layout``) only: never the listing index (``file.manifest``) or the store, which are built on it.
"""
