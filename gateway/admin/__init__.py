"""Administration: accounts, quotas, credits, ledger views, usage reports, fair share."""
