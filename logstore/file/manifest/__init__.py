"""The listing index: per site, which conversations exist and in what order they were last appended to.

Owns the manifest's journal and snapshot formats (``codec``, ``snapshot``), its packed in-memory table
(``table``), reading it from disk (``state``), the journal generations: found by listing, sealed,
rolled and folded (``journal``, ``compaction``), the change counter every sealer and remover bumps
first (``fence``), one process's hold on them (``site_journal``: which journal it appends to,
catching up, rolls, noticing a manifest removed under it by a purge; ``journal_sync``: records synced
outside the index's lock, one fdatasync shared, the descriptor's use count), the per-site index the
store records each commit in and lists from (``site``: ``SiteManifest``, over ``site_journal``), and the
sweep that reconciles it with the logs after a crash (``reconcile``: sessions by boot id, pid and start
ticks; below ``site``, it calls back into the index through its own ``SweptIndex`` protocol, which
``sweep_side`` implements). Everything in it can be rebuilt from the logs,
which stay the truth. Imports ``logstore.core``, the file engine's base modules (``fileio``, ``locking``,
``boot``, ``layout``, ``statx``, ``shared_map``) and ``file.log`` (to read a log's end when reconciling);
the log never imports it.
"""
