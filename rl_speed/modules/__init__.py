"""rl_speed's RLModules (torch)."""
