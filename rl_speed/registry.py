"""What rl_speed makes known to Ray Tune, RLlib and gymnasium, and how names resolve to classes.

Environments are registered under versioned ids (``rl_speed/Snake-v0``) both with Tune's ``register_env`` (what
RLlib looks up first, also on remote workers) and with gymnasium (``gym.make`` / ``gym.make_vec``).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import gymnasium as gym

import rl_speed_envs

#: env id -> (scalar env class path, vector env class path or None)
ENVIRONMENTS: dict[str, tuple[str, str | None]] = {
    **rl_speed_envs.GYMNASIUM_IDS,
    # The per-map form for stock RLlib is a MultiAgentEnv (ray-side); the vector form has agents as lanes.
    "rl_speed/GridArena-v0": ("rl_speed.multi_agent:GridArenaMultiAgentEnv",
                              "rl_speed_envs.grid_arena:GridArenaVectorEnv"),
    # The real MettaGrid ([mettagrid] extra): the PettingZoo form for stock RLlib, the buffer-bound vector form.
    "rl_speed/MettaGrid-v0": ("rl_speed.multi_agent:MettaGridMultiAgentEnv",
                              "rl_speed_envs.mettagrid:MettaGridVectorEnv"),
}
#: algorithm name -> "module:Class"; filled as rl_speed's algorithms land.
ALGORITHMS: dict[str, str] = {
    "FastDQN": "rl_speed.algorithms.fast_dqn:FastDQN",
    "FastPPO": "rl_speed.algorithms.fast_ppo:FastPPO",
}

#: short names for ``rl_module:`` in YAML files -> "module:Class".
MODULES: dict[str, str] = {
    "recurrent": "rl_speed.modules.recurrent:RecurrentActorCritic",
    "q_net": "rl_speed.modules.q_net:QNetModule",
    "graph": "rl_speed.modules.graph:GraphActorCritic",
    "tokens": "rl_speed.modules.tokens:TokenActorCritic",
    "recurrent_tokens": "rl_speed.modules.tokens:RecurrentTokenActorCritic",
    "nature": "rl_speed.modules.pixels:NatureActorCritic",
}

_registered = False


def _load(path: str) -> Any:
    """Imports ``"package.module:Name"``."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def make_env_creator(env_id: str) -> Callable[[dict], gym.Env | gym.vector.VectorEnv]:
    """A Tune env creator: builds the scalar env, or the native vector env when RLlib passes ``num_envs``.

    RLlib's ``gym_env_vectorize_mode="vector_entry_point"`` calls the creator with ``env_config | {"num_envs": N}``;
    ``"sync"``/``"async"`` call it once per sub-env without ``num_envs``.
    """
    scalar_path, vector_path = ENVIRONMENTS[env_id]

    def creator(env_config: dict) -> gym.Env | gym.vector.VectorEnv:
        kwargs = dict(env_config)
        if "num_envs" in kwargs:
            if vector_path is None:
                raise ValueError(f"{env_id} has no native vector form; set gym_env_vectorize_mode: sync (one env "
                                 "per sub-env, stepped by gymnasium).")
            return _load(vector_path)(**kwargs)
        return _load(scalar_path)(**kwargs)

    return creator


def check_env_keys(env_id: str, env_config: dict) -> None:
    """Raises ``ValueError`` naming the first key of ``env_config`` that is not an argument of an rl_speed env (no
    env is built, so this works before an optional extra is installed)."""
    scalar = _load(ENVIRONMENTS[env_id][0])
    accepted = list(getattr(scalar, "config_keys", None)
                    or [p for p in inspect.signature(scalar.__init__).parameters if p != "self"])
    for key in env_config:
        if key not in accepted:
            raise ValueError(f"`env_config` key {key!r} is not an argument of {env_id}; accepted: {', '.join(accepted)}.")


def runners_build_vector_form(config: Any) -> bool:
    """Whether ``config``'s env runners call the env creator for a native vector env of ``num_envs_per_env_runner``
    lanes (RLlib's ``gym_env_vectorize_mode="vector_entry_point"``, a string or gymnasium's enum)."""
    return str(config.gym_env_vectorize_mode).lower().endswith("vector_entry_point")


def check_env_config(env_id: str, env_config: dict, num_envs: int | None = None) -> None:
    """Raises ``ValueError`` naming the bad key or value if ``env_config`` does not fit an rl_speed env; with
    ``num_envs`` (the runners build the native vector form of that many lanes), as that vector form sees it."""
    check_env_keys(env_id, env_config)
    scalar_path, vector_path = ENVIRONMENTS[env_id]
    settings = dict(env_config)
    check_lanes = getattr(_load(vector_path), "check_lanes", None) if num_envs and vector_path else None
    if check_lanes is not None:  # settings that need several lanes (Atari's lane_groups), checked for num_envs
        settings = check_lanes(num_envs, settings)
    _load(scalar_path)(**settings).close()  # the env's own validation names bad values


def check_env_installed(env: Any) -> None:
    """Raises the env's own ``ImportError`` (with its install command) if an rl_speed env's optional extra is missing."""
    if isinstance(env, str) and env in ENVIRONMENTS:
        check = getattr(_load(ENVIRONMENTS[env][0]), "check_installed", None)
        if check is not None:
            check()


def register() -> None:
    """Registers environments (Tune + gymnasium) and algorithms (Tune). Safe to call any number of times."""
    global _registered
    if _registered:
        return
    from ray.tune.registry import register_env, register_trainable

    rl_speed_envs.register_gymnasium()
    for env_id in ENVIRONMENTS:
        register_env(env_id, make_env_creator(env_id))
    for name, path in ALGORITHMS.items():
        register_trainable(name, _load(path))
    _registered = True


def resolve_algorithm(name: str) -> type:
    """Maps a ``run:`` name to an Algorithm class: rl_speed's own first, then RLlib's built-ins.

    Raises ``KeyError`` with the known names when there is no such algorithm. Only the named algorithm is imported
    (passing a name string to Tune would import all of them).
    """
    if name in ALGORITHMS:
        return _load(ALGORITHMS[name])
    from ray.rllib.algorithms.registry import ALGORITHMS as RLLIB_ALGORITHMS

    if name in RLLIB_ALGORITHMS:
        algo_class, _ = RLLIB_ALGORITHMS[name]()
        return algo_class
    raise KeyError(name)


def known_algorithms() -> list[str]:
    from ray.rllib.algorithms.registry import ALGORITHMS as RLLIB_ALGORITHMS

    return sorted(set(ALGORITHMS) | set(RLLIB_ALGORITHMS))


def env_is_known(env: str) -> bool:
    """True if RLlib can build ``env``: a Tune-registered name, a gymnasium id, or a ``module:EnvId`` string."""
    from ray.tune.registry import ENV_CREATOR, _global_registry

    if env in ENVIRONMENTS or _global_registry.contains(ENV_CREATOR, env) or env in gym.registry:
        return True
    if ":" in env:  # gymnasium imports the module, which registers the id
        try:
            gym.spec(env)
            return True
        except Exception:
            return False
    return False


def resolve_module(name: str) -> type:
    """An RLModule class from a short name in :data:`MODULES` or a ``"package.module:Class"`` path."""
    if not isinstance(name, str):
        raise ValueError(repr(name))
    if name in MODULES:
        return _load(MODULES[name])
    if ":" not in name:
        raise KeyError(repr(name))
    return _load(name)
