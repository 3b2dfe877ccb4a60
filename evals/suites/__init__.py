"""The cached-vs-uncached eval (`radixagent eval`): suites run twice, recorded, reported, charted."""
