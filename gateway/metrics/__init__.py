"""Prometheus metrics at ``/metrics``, computed from the registry at scrape time (collector.py)."""
