"""Simulators for rl_speed: plain numpy + gymnasium, never ray or torch.

The folder is ``envs/`` but the import name is ``rl_speed_envs`` so it cannot shadow a user's own ``envs`` module.
Nothing is registered at import time; ``rl_speed.register()`` (or :func:`register_gymnasium`) does that.
"""

from rl_speed_envs.snake import SnakeEnv, SnakeVectorEnv

__all__ = ["SnakeEnv", "SnakeVectorEnv", "register_gymnasium", "GYMNASIUM_IDS"]

#: gymnasium id -> (entry point, vector entry point or None)
GYMNASIUM_IDS = {
    "rl_speed/Snake-v0": ("rl_speed_envs.snake:SnakeEnv", "rl_speed_envs.snake:SnakeVectorEnv"),
    "rl_speed/CueCorridor-v0": ("rl_speed_envs.memory:CueCorridorEnv", "rl_speed_envs.memory:CueCorridorVectorEnv"),
    "rl_speed/Durotaxis-v0": ("rl_speed_envs.durotaxis:DurotaxisEnv",
                              "rl_speed_envs.durotaxis:DurotaxisVectorEnv"),
    # Needs the [atari] extra (ale-py and its ROMs); the vector form is ale-py's C++ vector env.
    "rl_speed/Atari-v0": ("rl_speed_envs.atari:AtariEnv", "rl_speed_envs.atari:AtariVectorEnv"),
    # Needs the [mario] extra (the NES emulator); no native vector form: RLlib's sync/async vectorization.
    "rl_speed/SuperMarioBros-v0": ("rl_speed_envs.mario:SuperMarioBrosEnv", None),
}


def register_gymnasium() -> None:
    """Registers every simulator with gymnasium (idempotent), so ``gym.make`` / ``gym.make_vec`` find them."""
    import gymnasium as gym

    for env_id, (entry_point, vector_entry_point) in GYMNASIUM_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, vector_entry_point=vector_entry_point)
