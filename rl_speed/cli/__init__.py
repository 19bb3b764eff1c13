"""The ``rl-speed`` and ``rllib`` console commands."""
