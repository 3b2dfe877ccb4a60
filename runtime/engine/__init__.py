"""The engine: requests, the scheduler, sampling, grammars and the step loop."""
