"""Evaluation: a trained policy's score, played directly on the env."""
