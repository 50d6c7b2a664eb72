"""Benchmarks for watchproxy (not part of the test suite). See bench/README.md."""
