"""`radixagent eval-cluster`: routing policies compared on a local cluster."""
