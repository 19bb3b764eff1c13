"""Throughput: env steps (or updates) per second of one setup, against stock RLlib and bare loops."""
