"""The file engine, in layers that import only downward (checked by tests/test_architecture.py):

- base modules: ``layout`` (every path), ``fileio`` (the one seam to the OS), ``statx``, ``locking``
  (flock), ``boot`` (the boot id);
- ``log``: one conversation's log (format, recovery, commit point, group commit, reads);
- ``manifest``: the per-site listing index, rebuildable from the logs;
- on top of both: ``store`` (``Store``, the file ``Backend``), ``credentials``, ``store_id``, ``erasure``.
"""
