"""rl_speed's RLlib Algorithm subclasses (import lazily: they pull in RLlib)."""
