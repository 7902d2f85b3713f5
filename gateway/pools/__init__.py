"""Pools: what each configured backend is, whether it can run jobs now, and why not."""
