"""Backend-neutral contract: what every storage backend and the server share (no I/O here)."""
