"""The gateway's scheduling policy: which waiting gang starts next, where, and when the
others will (conservative backfill with reservations; docs/dispatch.md)."""
