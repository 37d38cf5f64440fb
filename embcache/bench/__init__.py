"""Benchmarks behind `embcache bench`: each module builds its own parser and writes its
results under bench/results/ (see bench/README.md)."""
