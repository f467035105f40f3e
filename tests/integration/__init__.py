"""Integration tests: real servers on loopback, real clients."""
