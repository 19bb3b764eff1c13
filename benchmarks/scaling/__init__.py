"""Scaling: how the rate grows with env runners, learners and GPUs."""
