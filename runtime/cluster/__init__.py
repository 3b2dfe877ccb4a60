"""`radixagent cluster`: local workers behind a router, and their supervisor."""
