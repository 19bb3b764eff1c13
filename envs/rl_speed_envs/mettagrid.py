"""MettaGrid (the real package, optional extra ``[mettagrid]``) as a native vector env: many simulations in one process,
each bound to a slice of one pre-allocated buffer set, agents as lanes.

``MettaGridVectorEnv(num_envs)`` holds ``num_envs / num_agents`` simulations; lane ``s * num_agents + a`` is agent
``a`` of simulation ``s``. Each simulation's C++ core reads its actions from, and writes observations, rewards and
flags into, its slice of the shared arrays (``mettagrid.simulator.Simulator().new_simulation(..., buffers=...)``), so
a step is one ``sim.step()`` per simulation and no per-agent Python. Episodes end per simulation (every agent
truncated at ``max_steps``); the step after that starts a new simulation on the same slice (NEXT_STEP autoreset: the
reset step's actions are ignored, about 3 ms per new simulation).

The default arena (:func:`arena_config`), in which reward is reachable: a ``width x height`` room with ``walls``
wall blocks and ``altars`` altars at random cells. An agent that moves into an altar gets one heart, and each heart
is worth ``heart_reward``. Random play earns about 0.012 per agent step. The actions are mettagrid's: noop and moves
north/south/west/east. Observations are mettagrid's tokens: ``[num_tokens, 3]`` uint8 rows ``(location, feature,
value)``, where location is ``row << 4 | col`` in the ``view x view`` window, 254 marks a global token and 255 an
empty slot (empty slots come last). :class:`rl_speed.modules.tokens.TokenActorCritic` reads them.

``env_config`` keys (:data:`CONFIG_KEYS`), checked before anything starts: ``num_agents``, ``width``, ``height``,
``walls``, ``altars``, ``heart_reward``, ``view``, ``num_tokens``, ``max_steps``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rl_speed_envs.checks import check_int

DEFAULTS = {"num_agents": 24, "width": 25, "height": 25, "walls": 10, "altars": 10, "heart_reward": 1.0, "view": 13,
            "num_tokens": 200, "max_steps": 1000}
CONFIG_KEYS = tuple(DEFAULTS)


def install_hint() -> str:
    return ("MettaGrid needs the mettagrid package (the [mettagrid] extra; wheels for CPython 3.11/3.12 on Linux x86-64, "
            "glibc >= 2.34): python -m pip install 'rl_speed[mettagrid]'")


def check_installed() -> None:
    """Raises ``ImportError`` with :func:`install_hint` if mettagrid is missing (used at configuration time)."""
    try:
        import mettagrid.simulator  # noqa: F401
    except ImportError:
        raise ImportError(install_hint()) from None


def check_config(settings: dict) -> dict:
    """``settings`` merged over :data:`DEFAULTS`; raises ``ValueError`` naming the first bad key."""
    unknown = sorted(set(settings) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"MettaGrid: unknown env_config keys {unknown}; accepted: {', '.join(CONFIG_KEYS)}.")
    cfg = {**DEFAULTS, **settings}
    for key in ("num_agents", "width", "height", "view", "num_tokens", "max_steps"):
        check_int("MettaGrid", key, cfg[key], 1)
    for key in ("walls", "altars"):
        check_int("MettaGrid", key, cfg[key], 0)
    if cfg["view"] % 2 == 0 or cfg["view"] > 15:
        raise ValueError(f"MettaGrid: `view`={cfg['view']} must be odd and <= 15 (locations pack into 4 bits).")
    cells = (cfg["width"] - 2) * (cfg["height"] - 2)
    if cfg["num_agents"] + cfg["walls"] + cfg["altars"] > cells:
        raise ValueError(f"MettaGrid: {cfg['num_agents']} agents + {cfg['walls']} walls + {cfg['altars']} altars do "
                         f"not fit the {cells} free cells of a {cfg['width']} x {cfg['height']} map; make it larger.")
    if not isinstance(cfg["heart_reward"], (int, float)) or isinstance(cfg["heart_reward"], bool):
        raise ValueError(f"MettaGrid: `heart_reward`={cfg['heart_reward']!r} must be a number.")
    return cfg


def arena_config(**settings: Any) -> Any:
    """The rewarding arena as a ``mettagrid`` ``MettaGridConfig`` (see the module docstring)."""
    check_installed()
    import mettagrid.mapgen.scenes.random as random_scene
    from mettagrid.builder.envs import make_arena
    from mettagrid.config.handler_config import Handler
    from mettagrid.config.mettagrid_config import GridObjectConfig
    from mettagrid.config.mutation.resource_mutation import updateActor
    from mettagrid.config.reward_config import inventoryReward
    from mettagrid.mapgen.mapgen import MapGen

    cfg = check_config(settings)
    agents = cfg["num_agents"]
    config = make_arena(num_agents=agents)
    game = config.game
    game.objects["altar"] = GridObjectConfig(name="altar",
                                             on_use_handler=Handler(mutations=[updateActor({"heart": 1})]))
    game.agent.rewards = {"heart": inventoryReward("heart", weight=float(cfg["heart_reward"]))}
    game.max_steps = cfg["max_steps"]
    game.episode_truncates = True  # the time limit truncates (mettagrid's default marks it terminal)
    game.obs.width = game.obs.height = cfg["view"]
    game.obs.num_tokens = cfg["num_tokens"]
    game.map_builder = MapGen.Config(
        num_agents=agents, width=cfg["width"], height=cfg["height"], border_width=1, instance_border_width=0,
        instance=random_scene.Random.Config(agents=agents, objects={"wall": cfg["walls"], "altar": cfg["altars"]}))
    return config


class MettaGridVectorEnv(VectorEnv):
    """``num_envs`` lanes = simulations x agents (see the module docstring)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, **settings: Any) -> None:
        check_installed()
        from mettagrid.simulator import Simulator

        cfg = check_config(settings)
        agents = cfg["num_agents"]
        check_int("MettaGrid", "num_envs", num_envs, 1)
        if num_envs % agents:
            raise ValueError(f"MettaGrid: num_envs={num_envs} lanes must be a multiple of num_agents={agents} (a lane "
                             "is one agent of one simulation).")
        self.num_envs = num_envs
        self.num_agents = agents
        self.num_sims = num_envs // agents
        self._config = arena_config(**settings)
        self._simulator = Simulator()
        tokens = cfg["num_tokens"]
        self._obs = np.full((num_envs, tokens, 3), 255, np.uint8)
        self._terminals = np.zeros(num_envs, bool)
        self._truncations = np.zeros(num_envs, bool)
        self._rewards = np.zeros(num_envs, np.float32)
        self._masks = np.ones(num_envs, bool)
        self._actions = np.zeros(num_envs, np.int32)
        self._teacher = np.zeros(num_envs, np.int32)
        self._sims: list[Any] = [None] * self.num_sims
        self._steps: list[Any] = [None] * self.num_sims
        self._needs_reset = np.zeros(self.num_sims, bool)
        self._seed = 0
        self._episodes = 0
        probe = self._new_sim(0)
        num_actions = len(probe._action_names)
        self.single_observation_space = spaces.Box(0, 255, (tokens, 3), np.uint8)
        self.single_action_space = spaces.Discrete(num_actions)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.action_names = list(probe._action_names)

    def _new_sim(self, s: int) -> Any:
        """A new simulation bound to slice ``s`` of the buffers (its first observation written there)."""
        from mettagrid.simulator.simulator import Buffers

        lanes = slice(s * self.num_agents, (s + 1) * self.num_agents)
        buffers = Buffers(observations=self._obs[lanes], terminals=self._terminals[lanes],
                          truncations=self._truncations[lanes], rewards=self._rewards[lanes],
                          masks=self._masks[lanes], actions=self._actions[lanes], teacher_actions=self._teacher[lanes])
        seed = self._seed + self._episodes
        self._episodes += 1
        sim = self._simulator.new_simulation(self._config, seed, buffers=buffers)
        self._sims[s] = sim
        # The C++ core's step when the Python step would add nothing: it adds event handlers (none in the arena
        # this env builds) and talk (which nothing here queues) around the same call, and stopwatch timers, about
        # 15% of a step (mettagrid documents `_c_sim` for low-level callers).
        self._steps[s] = sim.step if sim._event_handlers else sim._c_sim.step
        return sim

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """New simulations everywhere; simulation ``s`` of ``reset(seed=k)`` uses seed ``k + s``, later episodes
        continue the count."""
        from mettagrid.simulator import Simulator

        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        # The map generator draws from its own seed, which the Simulator advances per simulation: a fresh Simulator
        # and a seeded map builder make reset(seed=k) repeat its maps.
        self._config.game.map_builder.seed = seed
        self._simulator = Simulator()
        self._seed, self._episodes = seed, 0
        for s in range(self.num_sims):
            self._new_sim(s)
        self._needs_reset[:] = False
        self._rewards[:] = 0.0
        self._terminals[:] = self._truncations[:] = False
        return self._obs.copy(), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"MettaGrid: expected {self.num_envs} actions, got shape {actions.shape}.")
        self._actions[:] = actions
        agents = self.num_agents
        for s, step in enumerate(self._steps):
            if self._needs_reset[s]:  # NEXT_STEP autoreset: this step only starts the next episode
                self._new_sim(s)
                lanes = slice(s * agents, (s + 1) * agents)
                self._rewards[lanes] = 0.0
                self._terminals[lanes] = self._truncations[lanes] = False
            else:
                step()
        done = (self._terminals | self._truncations).reshape(self.num_sims, agents).all(axis=1)
        self._needs_reset[:] = done
        return self._obs.copy(), self._rewards.copy(), self._terminals.copy(), self._truncations.copy(), {}

    def close_extras(self, **kwargs: Any) -> None:
        self._sims, self._steps = [], []
