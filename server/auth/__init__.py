"""Who the caller is, and what one site may hold: authentication and per-site admission.

Owns HTTP Basic authentication against a ``SiteRegistry`` with its remembered outcomes (``basic``), the
admission of password verifications: scrypt pool, fair shares, failure throttle (``kdf_gate``), and the
legacy-protocol sessions with per-site and global caps (``sessions``, bound to the authenticated site). It
may import ``logstore.core``, third-party libraries and ``server.transport`` (the limits, the JSON error
answer); never ``server.mcp``, ``server.ui`` or the top-level modules that compose the server.
"""
