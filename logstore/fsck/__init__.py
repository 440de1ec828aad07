"""Verification, repair, dump and export of a file-engine data dir, built on logstore.file's readers."""
