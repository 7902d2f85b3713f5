"""The quota ledger: append-only entries, materialised balances, admission, fair share."""
