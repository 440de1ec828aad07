"""The file engine: frame and index codecs, on-disk layout, recovery, group commit, manifest, Store."""
