"""Signed webhooks for job state changes (docs/webhooks.md)."""
