"""The read-only conversation browser at ``/ui/`` (docs/UI.md): ``server.ui.app.build_ui_app``."""
