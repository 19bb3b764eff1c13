"""RLlib ``MultiAgentEnv`` forms of rl_speed's multi-agent simulators, for users who train with stock RLlib.

FastPPO's fastest path steps the batched forms (agents flattened into lanes, one shared policy, no
``multi_agent()``). These forms run with RLlib's own multi-agent runner (a Python episode per agent) and with FastPPO's
multi-agent columns (``config.multi_agent(...)``).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
from ray.rllib.utils.annotations import override

from rl_speed_envs.grid_arena import CONFIG_KEYS, GridArena
from rl_speed_envs.mettagrid import CONFIG_KEYS as METTAGRID_KEYS
from rl_speed_envs.mettagrid import arena_config
from rl_speed_envs.mettagrid import check_installed as check_mettagrid_installed


class GridArenaMultiAgentEnv(MultiAgentEnv):
    """One grid-arena map; agents are ``"agent_0"`` ... ``"agent_{A-1}"``, all acting every step (same dynamics as
    :class:`rl_speed_envs.grid_arena.GridArenaVectorEnv`). Accepts the arena's config keys as keyword arguments."""

    config_keys = CONFIG_KEYS  # what `env_config` may hold (checked by the CLI before Ray starts)

    @override(MultiAgentEnv)
    def __init__(self, config: dict | None = None, **kwargs: Any) -> None:
        super().__init__()
        settings = {**(config or {}), **kwargs}
        unknown = sorted(set(settings) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"GridArena: unknown config keys {unknown}; accepted: {', '.join(CONFIG_KEYS)}.")
        self.arena = GridArena(**settings)
        self.agents = self.possible_agents = [f"agent_{i}" for i in range(self.arena.cfg.num_agents)]
        self.observation_spaces = {aid: self.arena.observation_space for aid in self.agents}
        self.action_spaces = {aid: self.arena.action_space for aid in self.agents}

    @override(MultiAgentEnv)
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs = self.arena.reset(seed=seed)
        return dict(zip(self.agents, obs)), {}

    @override(MultiAgentEnv)
    def step(self, action_dict: dict) -> tuple[dict, dict, dict, dict, dict]:
        try:
            actions = [action_dict[aid] for aid in self.agents]
        except KeyError:
            missing = [aid for aid in self.agents if aid not in action_dict]
            raise ValueError(f"GridArena: every agent acts every step; no action for {missing[:5]}"
                             f"{'...' if len(missing) > 5 else ''}.") from None
        obs, rewards, terminated, truncated = self.arena.step(actions)
        done, cut = dict.fromkeys(self.agents, terminated), dict.fromkeys(self.agents, truncated)
        done["__all__"], cut["__all__"] = terminated, truncated
        return dict(zip(self.agents, obs)), dict(zip(self.agents, rewards.tolist())), done, cut, {}


class MettaGridMultiAgentEnv(ParallelPettingZooEnv):
    """The real MettaGrid arena (``[mettagrid]`` extra, :mod:`rl_speed_envs.mettagrid`) through mettagrid's own
    PettingZoo ParallelEnv and RLlib's ``ParallelPettingZooEnv`` wrapper: the path a stock RLlib user takes (one
    simulation per env, per-agent dicts). Agents are the integers ``0 .. num_agents - 1``. Accepts the same
    ``env_config`` keys as the vector form (:data:`rl_speed_envs.mettagrid.CONFIG_KEYS`)."""

    config_keys = METTAGRID_KEYS
    check_installed = staticmethod(check_mettagrid_installed)

    @override(ParallelPettingZooEnv)
    def __init__(self, config: dict | None = None, **kwargs: Any) -> None:
        check_mettagrid_installed()
        from mettagrid.envs.pettingzoo_env import MettaGridPettingZooEnv
        from mettagrid.simulator import Simulator

        super().__init__(MettaGridPettingZooEnv(Simulator(), arena_config(**{**(config or {}), **kwargs})))
