"""Benchmarks run by ``rl-speed bench NAME`` (not by pytest): each prints a markdown section for BENCHMARKS.md."""
