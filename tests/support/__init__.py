"""Helpers the test folders share: a live server on loopback, a scripted fake backend, the agent behaviour suite."""
