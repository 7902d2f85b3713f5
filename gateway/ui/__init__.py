"""The people-facing web pieces: the /ui dashboard and the local /docs and /redoc assets (docs/ui.md)."""
