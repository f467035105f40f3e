"""Telemetry both sides of pyserve use, the core and the workers: OpenTelemetry spans and the process's log output.

A neutral layer: it imports only pyserve's shared definitions, so workers use it without importing the core.
"""
