"""`radixagent eval-misses`: injected cache-miss causes, each checked against the trace's `miss`
attribution (issue 19). `inject.py` runs sessions on the embedded engine, `served.py` through
`serve --trace-dir` with the `openai` client, `cli.py` prints the table."""
