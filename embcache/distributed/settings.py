"""Defaults of multi-process runs that the command line shows without importing torch."""

DEFAULT_TIMEOUT_S = 300.0  # seconds a rank waits for the others in a collective (`--dist-timeout`)
