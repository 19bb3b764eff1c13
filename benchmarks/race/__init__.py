"""Races: wall-clock time to a score, every contender judged by one common judge of episode returns."""
