"""The audit log: who changed what, hash-chained (gateway/audit/service.py)."""
