"""The trace ledger: per-request records of what the cache served."""
