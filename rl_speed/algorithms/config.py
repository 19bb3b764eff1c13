"""ColumnarConfigMixin: the config keys every columnar algorithm adds to RLlib's, and every config-time check they
share. Checks that belong to one algorithm live in its config class's ``validate``.

Algorithm configs import this module, never the other way round: a check that depends on the algorithm asks the
config (e.g. ``supports_cuda_graph``), not the algorithm's class.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import tree

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.utils.annotations import override

from rl_speed.env_runners import BatchedEnvRunner
from rl_speed.learners.optimizer_step import PRECISIONS
from rl_speed.learners.user_learner import rllib_base, stack_on_columns


class ColumnarConfigMixin:
    """What every columnar algorithm config shares; mix in before RLlib's config class.

    Defaults: the env runner is :class:`BatchedEnvRunner`. Keys (through ``training()``):

    * ``sync_weights_every``: push learner weights to the env runners every this many iterations (default 1).
    * ``async_sampling``: remote runners sample the next batch while the learner updates (see
      :class:`rl_speed.algorithms.sampling.ColumnSampler`; default False).
    * ``mixed_precision`` ("off" | "bf16" | "fp16") and ``grad_accumulation_steps`` (default 1): the learner's
      update step (see :mod:`rl_speed.learners.optimizer_step`).
    * ``cuda_graph`` (default False): a CUDA learner replays its whole optimizer step as one captured CUDA graph
      (see :mod:`rl_speed.learners.cuda_graph`); only where ``supports_cuda_graph``.
    * ``cuda_graph_env_runners`` (default False): each remote env runner with its module on a GPU
      (``num_gpus_per_env_runner`` > 0) replays its action step as one captured CUDA graph (see
      :mod:`rl_speed.env_runners.captured_forward`); only where ``supports_cuda_graph_env_runners``.
    * ``shared_inference`` (default False): the remote env runners' action step is served by one thread of the
      local learner's process, on the learner's device, instead of a forward in each runner (see
      :mod:`rl_speed.env_runners.shared_inference`); only where ``supports_shared_inference``.
    """

    #: Whether the algorithm's loss can be captured in a CUDA graph (no host syncs); set by the algorithm's config.
    supports_cuda_graph: bool = False
    #: Whether a captured step may run on several learners: every learner then runs the same minibatch shapes in
    #: lockstep (FastPPO's even batch split), since each step is one all-reduce (rl_speed.learners.gradient_all_reduce).
    cuda_graph_learners: bool = False
    #: Whether the algorithm's runners act by sampling a categorical policy, which a captured action step can hold
    #: (an epsilon-greedy module picks actions from Python's timestep); set by the algorithm's config.
    supports_cuda_graph_env_runners: bool = False
    #: Whether the algorithm's remote runners may act through the learner's process's inference server (a categorical
    #: policy drawn from the module's logits; FastPPO).
    supports_shared_inference: bool = False
    #: Whether multi-agent columns may train on several DDP learners (FastPPO: see rl_speed.learners.update_loop).
    multi_agent_learners: bool = False

    @override(AlgorithmConfig)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env_runner_cls = BatchedEnvRunner
        # The training step merges the runners' connector states itself, from states handed over with each batch
        # (rl_speed.algorithms.sampling.sync_connector_states): RLlib's own sync after each iteration is one more
        # round trip, which queues behind the runners' in-flight samples.
        self._dont_auto_sync_env_runner_states = True
        self.sync_weights_every: int = 1
        self.async_sampling: bool = False
        self.mixed_precision: str = "off"
        self.grad_accumulation_steps: int = 1
        self.cuda_graph: bool = False
        self.cuda_graph_env_runners: bool = False
        self.shared_inference: bool = False

    @override(AlgorithmConfig)
    def training(self, *, sync_weights_every: int = NotProvided, async_sampling: bool = NotProvided,
                 mixed_precision: str = NotProvided, grad_accumulation_steps: int = NotProvided,
                 cuda_graph: bool = NotProvided, cuda_graph_env_runners: bool = NotProvided,
                 shared_inference: bool = NotProvided, **kwargs: Any) -> Any:
        super().training(**kwargs)
        if shared_inference is not NotProvided:
            self.shared_inference = shared_inference
        if cuda_graph is not NotProvided:
            self.cuda_graph = cuda_graph
        if cuda_graph_env_runners is not NotProvided:
            self.cuda_graph_env_runners = cuda_graph_env_runners
        if mixed_precision is not NotProvided:
            self.mixed_precision = mixed_precision
        if grad_accumulation_steps is not NotProvided:
            self.grad_accumulation_steps = grad_accumulation_steps
        if sync_weights_every is not NotProvided:
            self.sync_weights_every = sync_weights_every
        if async_sampling is not NotProvided:
            self.async_sampling = async_sampling
        return self

    @property
    @override(AlgorithmConfig)
    def learner_class(self) -> type:
        """The columnar learner, or a user's ``learner_class`` stacked on it (rl_speed.learners.user_learner)."""
        columnar = self.get_default_learner_class()
        chosen = user_learner_class(self)
        if chosen is None:
            return columnar
        # (a class of another family is returned as it is, and refused by validate: check_learner_class)
        return stack_on_columns(chosen, columnar) if extends_rllib_base(chosen, columnar) else chosen

    def validate_columnar(self, name: str) -> None:
        """The shared checks; called first in each algorithm config's ``validate``."""
        from rl_speed.registry import check_env_installed

        check_env_installed(self.env)  # a missing optional extra (e.g. [mario]) fails here, with its install command
        if (self.gym_env_vectorize_mode in ("sync", gym.VectorizeMode.SYNC) and has_vector_entry_point(self.env)
                and not self.is_multi_agent):  # (RLlib vectorizes MultiAgentEnvs with "sync" only)
            self.gym_env_vectorize_mode = "vector_entry_point"  # the native vector env where the env has one
        if not isinstance(self.async_sampling, bool):
            self._value_error(f"{name}: `async_sampling`={self.async_sampling!r} must be true or false.")
        if not isinstance(self.sync_weights_every, int) or self.sync_weights_every < 1:
            self._value_error(f"{name}: `sync_weights_every`={self.sync_weights_every!r} must be an integer >= 1.")
        check_optimizer_step_keys(self, name)
        check_cuda_graph_keys(self, name)
        check_cuda_graph_env_runners(self, name)
        check_shared_inference(self, name)
        check_learner_class(self, name)
        check_model_config_keys(self, name)
        if not self.in_evaluation and self.batch_mode != "truncate_episodes":
            self._value_error(f"{name}: `batch_mode` must be 'truncate_episodes' for training (columns have a fixed "
                              "length); evaluation may use 'complete_episodes' (it samples RLlib's episodes).")
        if self.num_envs_per_env_runner < 1:
            self._value_error(f"{name}: `num_envs_per_env_runner`={self.num_envs_per_env_runner!r} must be >= 1.")
        if not self.in_evaluation:
            check_multi_agent(self, name)
            check_connectors(self, name)


def has_vector_entry_point(env: Any) -> bool:
    """True if ``env`` names an rl_speed env or a gymnasium id with a native vector form."""
    if not isinstance(env, str):
        return False
    from rl_speed.registry import ENVIRONMENTS

    if env in ENVIRONMENTS:
        return ENVIRONMENTS[env][1] is not None
    try:
        return gym.spec(env).vector_entry_point is not None
    except Exception:
        return False


def make_probe_env(config: Any) -> Any:
    """One instance of the configured env, built on the driver as RLlib's runners build it (a Tune-registered
    creator, a class or callable, or a gymnasium id), for checks that must run before Ray starts."""
    from ray.tune.registry import ENV_CREATOR, _global_registry

    env_config = dict(config.env_config)
    if isinstance(config.env, str) and _global_registry.contains(ENV_CREATOR, config.env):
        return _global_registry.get(ENV_CREATOR, config.env)(env_config)
    if callable(config.env):
        return config.env(env_config)
    return gym.make(config.env, **env_config)


def makes_multi_agent_env(config: Any) -> bool:
    """Whether the configured env is an RLlib ``MultiAgentEnv`` (a class is checked without building it; a
    Tune-registered creator is built once)."""
    from ray.rllib.env.multi_agent_env import MultiAgentEnv
    from ray.tune.registry import ENV_CREATOR, _global_registry

    from rl_speed.registry import ENVIRONMENTS, runners_build_vector_form

    env = config.env
    if isinstance(env, type):
        return issubclass(env, MultiAgentEnv)
    if isinstance(env, str) and env not in ENVIRONMENTS and _global_registry.contains(ENV_CREATOR, env):
        if runners_build_vector_form(config):
            # The runners call the creator for a vector env (env_config | {"num_envs": N}); probe what they get.
            probe = _global_registry.get(ENV_CREATOR, env)({**config.env_config,
                                                            "num_envs": config.num_envs_per_env_runner})
        else:
            probe = make_probe_env(config)
        try:
            return isinstance(getattr(probe, "unwrapped", probe), MultiAgentEnv)
        finally:
            probe.close()
    return False


def check_multi_agent(config: Any, name: str) -> None:
    """Multi-agent configs: the runner that samples multi-agent columns, or a config-time error naming what the
    columnar path cannot do (and what to use instead)."""
    from rl_speed.env_runners.multi_agent import MultiAgentBatchedEnvRunner, check_multi_agent_env

    if not config.is_multi_agent:
        if makes_multi_agent_env(config):
            config._value_error(f"{name}: the env {config.env!r} is a MultiAgentEnv, but the config is single-agent; "
                                "call `config.multi_agent(policies={...}, policy_mapping_fn=...)` (one shared "
                                "policy: `policies={'shared'}, policy_mapping_fn=lambda aid, ep, **kw: 'shared'`).")
        return
    if config.env_runner_cls is BatchedEnvRunner:
        config.env_runner_cls = MultiAgentBatchedEnvRunner
    if not issubclass(config.env_runner_cls, MultiAgentBatchedEnvRunner):
        config._value_error(f"{name}: multi-agent training samples with MultiAgentBatchedEnvRunner (or a subclass); "
                            f"`env_runner_cls`={config.env_runner_cls.__name__} has no multi-agent columns.")
    problems = []
    if config.num_learners > 1 and not config.multi_agent_learners:
        problems.append(f"`num_learners`={config.num_learners}: {name}'s multi-agent training runs on one learner "
                        "(several are built for FastPPO only); use 0 or 1")
    if (config.model_config or {}).get("use_lstm") or getattr(config, "is_recurrent", False):
        problems.append("recurrent modules (`use_lstm`, rl_speed's recurrent module, or a module of your own with a "
                        "recurrent state) are single-agent only here")
    if config.count_steps_by != "env_steps":
        problems.append(f"`count_steps_by`={config.count_steps_by!r}: batches are counted in env steps here (a rollout "
                        "is `rollout_fragment_length` env steps of every copy); use 'env_steps'")
    if config.algorithm_config_overrides_per_module:
        problems.append("`algorithm_config_overrides_per_module` is not applied to the columnar advantages (gamma, "
                        "lambda) yet, so it is refused as a whole rather than half applied; set the keys on the config itself")
    if problems:
        config._value_error(f"{name} (multi-agent): " + "; ".join(problems) + ". Or use stock RLlib.")
    env = make_probe_env(config)
    try:
        module_obs_spaces = multi_agent_connector_spaces(config, env, name)
        check_multi_agent_env(env, name, turn_based=getattr(config, "supports_turn_based_envs", False),
                              mixed_spaces=getattr(config, "supports_mixed_spaces", False),
                              module_obs_spaces=module_obs_spaces)
    except ValueError as e:
        config._value_error(str(e))
    finally:
        env.close()


def multi_agent_connector_spaces(config: Any, env: Any, name: str) -> dict | None:
    """The user's multi-agent env-to-module pieces, built on the driver as the runners build them: each agent's
    observation space after them (None without pieces); a piece without a per-copy form is refused, naming it."""
    from ray.rllib.env import INPUT_ENV_SINGLE_SPACES

    from rl_speed.connectors.env_to_module import UnsupportedConnector, multi_agent_pipeline

    if config._env_to_module_connector is None:
        return None
    agents = list(env.unwrapped.possible_agents or [])
    spaces = tuple(gym.spaces.Dict({aid: get(aid) for aid in agents})
                   for get in (env.unwrapped.get_observation_space, env.unwrapped.get_action_space))
    try:
        pipeline = config.build_env_to_module_connector(spaces={INPUT_ENV_SINGLE_SPACES: spaces})
    except Exception as e:  # RLlib's own pieces fail here on spaces they cannot take
        raise ValueError(f"{name}: `env_to_module_connector` could not be built for the env's spaces: "
                         f"{type(e).__name__}: {e}") from e
    try:
        forms = multi_agent_pipeline(pipeline)
    except UnsupportedConnector as e:
        raise ValueError(f"{name}: `env_to_module_connector`: {e}") from e
    return dict(forms[-1].piece.observation_space.spaces) if forms else None


def probe_spaces(config: Any) -> tuple[gym.Space, gym.Space]:
    """The env's single observation and action spaces: from the config if given, else from one env instance built
    on the driver (for checks that must run before RLlib builds runners and modules)."""
    if config.observation_space is not None and config.action_space is not None:
        return config.observation_space, config.action_space
    env = make_probe_env(config)
    try:
        return (config.observation_space or getattr(env, "single_observation_space", env.observation_space),
                config.action_space or getattr(env, "single_action_space", env.action_space))
    finally:
        env.close()


def first_observation(config: Any) -> Any:
    """The env's first observation (seed 0) as a batch of one, ``[1, ...]``, from an env built on the driver."""
    env = make_probe_env(config)
    try:
        obs, _ = env.reset(seed=0)
        if hasattr(env, "num_envs") and hasattr(env, "single_observation_space"):  # a vector env: its first lane
            return tree.map_structure(lambda o: np.asarray(o)[:1], obs)
        return tree.map_structure(lambda o: np.asarray(o)[None], obs)
    finally:
        env.close()


def check_connectors(config: Any, name: str) -> None:
    """Every connector setting is honoured on the columnar path or refused here, before Ray starts.

    Env-to-module pieces run in their columnar forms (:mod:`rl_speed.connectors.env_to_module`); the learner and
    module-to-env pipelines do not exist on the columnar path (the learner gets columns, the runner computes actions
    itself), so custom pieces there are refused, except RLlib's ``FrameStackingLearner``, whose work the columns
    already hold (the runner stores the stacked frames its env-to-module counterpart makes).
    """
    from ray.rllib.connectors.common.frame_stacking import FrameStacking
    from ray.rllib.env import INPUT_ENV_SINGLE_SPACES

    from rl_speed.connectors.env_to_module import UnsupportedConnector, columnar_pipeline, probe_raw_pieces

    for key in ("env_to_module", "module_to_env", "learner"):
        if not getattr(config, f"add_default_connectors_to_{key}_pipeline"):
            config._value_error(f"{name}: `add_default_connectors_to_{key}_pipeline=False` asks for a hand-built "
                                f"{key.replace('_', '-')} pipeline, which the columnar path does not run; leave it "
                                "True, or use stock RLlib.")
    if config._module_to_env_connector is not None:
        config._value_error(f"{name}: `module_to_env_connector` pieces do not run on the columnar path (the runner "
                            "samples actions from the module's outputs itself); post-process actions in the env "
                            "(a gymnasium wrapper) or the RLModule, or use stock RLlib.")
    # (multi-agent pieces are built and checked per env copy by check_multi_agent)
    env_pieces = config._env_to_module_connector is not None and not config.is_multi_agent
    if not env_pieces and config._learner_connector is None:
        return
    obs_space, act_space = probe_spaces(config)
    if env_pieces:
        try:
            pipeline = config.build_env_to_module_connector(
                spaces={INPUT_ENV_SINGLE_SPACES: (obs_space, act_space)})
        except Exception as e:  # RLlib's own pieces fail here on spaces they cannot take
            config._value_error(f"{name}: `env_to_module_connector` could not be built for the env's spaces "
                                f"(observations {obs_space}, actions {act_space}): {type(e).__name__}: {e}")
        try:
            probe_raw_pieces(columnar_pipeline(pipeline, num_lanes=1), lambda: first_observation(config))
        except UnsupportedConnector as e:
            config._value_error(f"{name}: `env_to_module_connector`: {e}")
    if config._learner_connector is not None:
        pieces = config._learner_connector(obs_space, act_space)
        pieces = list(pieces) if isinstance(pieces, (list, tuple)) else [pieces]
        others = [type(p).__name__ for p in pieces
                  if not (isinstance(p, FrameStacking) and p._as_learner_connector)]  # FrameStackingLearner
        if others:
            config._value_error(f"{name}: `learner_connector` pieces {others} do not run on the columnar path (the "
                                "learner trains on columns, not episodes); do the work in an env-to-module piece "
                                "with a columnar form, the env, or the RLModule, or use stock RLlib.")


def user_learner_class(config: Any) -> type | None:
    """The ``learner_class`` a user set (a class, or a dotted path as in YAML), or None."""
    chosen = config._learner_class
    if isinstance(chosen, str):
        from ray.rllib.utils.serialization import deserialize_type

        chosen = deserialize_type(chosen) or chosen
    return chosen


def extends_rllib_base(chosen: Any, columnar: type) -> bool:
    """Whether a user's learner class can be stacked on ``columnar``: it extends the RLlib learner that one extends."""
    return isinstance(chosen, type) and issubclass(chosen, rllib_base(columnar))


def check_learner_class(config: Any, name: str) -> None:
    """A user's ``learner_class`` runs stacked on the columnar learner (:mod:`rl_speed.learners.user_learner`), so it
    must extend the RLlib learner that one extends (PPOTorchLearner / DQNTorchLearner) or the columnar one itself."""
    chosen = user_learner_class(config)
    if chosen is None:
        return
    columnar = config.get_default_learner_class()
    if not extends_rllib_base(chosen, columnar):
        base = rllib_base(columnar)
        config._value_error(
            f"{name}: `learner_class`={getattr(chosen, '__name__', chosen)!r} does not extend RLlib's "
            f"{base.__name__}: {name} runs a user's learner stacked on its columnar learner ({columnar.__name__}), "
            f"whose RLlib base is {base.__name__}. Subclass {base.__name__} (or {columnar.__name__}), or use stock "
            "RLlib.")


def check_optimizer_step_keys(config: Any, name: str) -> None:
    """Config-time errors for ``mixed_precision`` and ``grad_accumulation_steps``."""
    mode = config.mixed_precision
    if mode not in PRECISIONS:
        config._value_error(f"{name}: `mixed_precision`={mode!r} is not one of {', '.join(PRECISIONS)}; use 'bf16' "
                            "(CPU or GPU), 'fp16' (CUDA learners, with a grad scaler) or 'off'.")
    if mode == "fp16" and not config.num_gpus_per_learner:
        config._value_error(f"{name}: `mixed_precision`='fp16' needs a CUDA learner (fp16 autocast and its grad "
                            "scaler are GPU features), but `num_gpus_per_learner` is 0; set "
                            "`num_gpus_per_learner: 1`, or use 'bf16' on CPU.")
    k = config.grad_accumulation_steps
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        config._value_error(f"{name}: `grad_accumulation_steps`={k!r} must be an integer >= 1 (1 = no accumulation).")


def check_cuda_graph_keys(config: Any, name: str) -> None:
    """Config-time errors for ``cuda_graph``: everything a replayed graph cannot see (see
    :mod:`rl_speed.learners.cuda_graph`)."""
    on = config.cuda_graph
    if not isinstance(on, bool):
        config._value_error(f"{name}: `cuda_graph`={on!r} must be true or false.")
    if not on:
        return
    problems = []
    if not config.supports_cuda_graph:
        problems.append(f"{name}'s loss has not been made free of host syncs, which a captured step needs")
    if user_learner_class(config) is not None:
        problems.append("a `learner_class` of yours runs its own code in the step, which has not been checked for "
                        "host syncs (a captured graph cannot hold them); leave `cuda_graph` off with it")
    if config.is_multi_agent:
        problems.append("several modules train one after another in the update loop, and one captured step holds "
                        "every module's optimizer; capture is for a single module")
    if getattr(config, "uses_padded_sequences", (config.model_config or {}).get("use_lstm")):
        problems.append("RLlib's LSTM (`model_config.use_lstm`) trains on padded sequences whose number changes with "
                        "every batch, so no captured graph would be replayed; use `rl_module: recurrent`")
    if not config.num_gpus_per_learner:
        problems.append("it needs a CUDA learner (`num_gpus_per_learner: 1`)")
    if config.mixed_precision == "fp16":
        problems.append("fp16's grad scaler keeps its state in Python; use `mixed_precision: bf16`")
    several_learners = (config.num_learners or 0) > 1
    if several_learners and not config.cuda_graph_learners:
        problems.append(f"{name}'s learners may sample minibatches of different shapes, and each captured step is "
                        "one all-reduce among them; use `num_learners` 0 or 1")
    if several_learners and config.torch_ddp_kwargs:
        problems.append(f"`torch_ddp_kwargs`={config.torch_ddp_kwargs!r}: on several learners a captured step "
                        "averages the gradients itself instead of DDP (rl_speed.learners.gradient_all_reduce), so "
                        "DDP's options would have no effect; leave `torch_ddp_kwargs` unset")
    if config.torch_compile_learner and config.torch_compile_learner_what_to_compile != "forward_train":
        problems.append("torch.compile of the complete update does not compose with it; compile `forward_train`")
    if config.torch_compile_learner and config.torch_compile_learner_dynamo_mode in (
            "reduce-overhead", "max-autotune"):
        problems.append(f"dynamo mode {config.torch_compile_learner_dynamo_mode!r} captures CUDA graphs itself; "
                        "leave `torch_compile_learner_dynamo_mode` unset")
    if problems:
        config._value_error(f"{name}: `cuda_graph: true` cannot be used here: " + "; ".join(problems) + ".")


def check_cuda_graph_env_runners(config: Any, name: str) -> None:
    """Config-time errors for ``cuda_graph_env_runners``; what only the runner knows (its module's distribution,
    its observations) it checks when it is built (rl_speed.env_runners.captured_forward.check_capturable)."""
    on = config.cuda_graph_env_runners
    if not isinstance(on, bool):
        config._value_error(f"{name}: `cuda_graph_env_runners`={on!r} must be true or false.")
    if not on or config.in_evaluation:  # (evaluation samples through RLlib's sample(), which acts eagerly)
        return
    problems = []
    if not config.supports_cuda_graph_env_runners:
        problems.append(f"{name}'s runners act through a module that picks its own actions from Python state "
                        "(e.g. epsilon-greedy), which a captured step would freeze")
    if config.is_multi_agent:
        problems.append("multi-agent runners act with one forward per module over changing lanes")
    if not config.num_env_runners:
        problems.append("it needs remote env runners (`num_env_runners` >= 1): RLlib keeps the local runner's "
                        "module on the CPU")
    if not config.num_gpus_per_env_runner:
        problems.append("it needs the runners' modules on a GPU (`num_gpus_per_env_runner` > 0, e.g. 0.05 each)")
    if (config.model_config or {}).get("use_lstm"):
        problems.append("RLlib's LSTM (`model_config.use_lstm`) carries a state the captured step does not hold")
    if problems:
        config._value_error(f"{name}: `cuda_graph_env_runners: true` cannot be used here: " + "; ".join(problems)
                            + ".")


def check_shared_inference(config: Any, name: str) -> None:
    """Config-time errors for ``shared_inference``; what only a runner knows (its module's distribution, its machine)
    it checks when it connects (rl_speed.env_runners.batched.BatchedEnvRunner.connect_shared_inference)."""
    on = config.shared_inference
    if not isinstance(on, bool):
        config._value_error(f"{name}: `shared_inference`={on!r} must be true or false.")
    if not on or config.in_evaluation:  # (evaluation runners act through RLlib's sample(), with their own module)
        return
    problems = []
    if not config.supports_shared_inference:
        problems.append(f"{name}'s runners act through a module that picks its own actions (e.g. epsilon-greedy)")
    if config.is_multi_agent:
        problems.append("multi-agent runners act with one forward per module over changing lanes")
    if not config.num_env_runners:
        problems.append("it serves remote env runners (`num_env_runners` >= 1); a local runner acts in the "
                        "learner's process already")
    if config.num_learners:
        problems.append(f"the server runs in the local learner's process (`num_learners: 0`), not in "
                        f"{config.num_learners} learner actors")
    if config.num_gpus_per_env_runner:
        problems.append("the runners' forward moves to the learner's process, so their GPU share "
                        f"(`num_gpus_per_env_runner`={config.num_gpus_per_env_runner}) would sit idle; set it to 0")
    if config.cuda_graph_env_runners:
        problems.append("the runners have no forward of their own to capture; leave `cuda_graph_env_runners` off")
    if (config.model_config or {}).get("use_lstm"):
        problems.append("RLlib's LSTM (`model_config.use_lstm`) carries a state per runner the server does not hold")
    if problems:
        config._value_error(f"{name}: `shared_inference: true` cannot be used here: " + "; ".join(problems) + ".")


def update_config(config: Any, changes: dict) -> Any:
    """``config`` with ``changes`` (config keys and values, as a YAML file's ``config:`` or ``--config``) applied:
    RLlib's ``update_from_dict``, except ``model_config``, which it cannot set (a read-only property there: it raises
    AttributeError); a given ``model_config`` replaces the config's whole one, as ``rl_module(model_config=...)``
    does. Returns the same config object."""
    rest = dict(changes)
    model_config = rest.pop("model_config", None)
    if rest:
        config = config.update_from_dict(rest)
    if model_config is not None:
        config.rl_module(model_config=model_config)
    return config


def check_model_config_keys(config: Any, name: str) -> None:
    """Each ``model_config`` key a user set must be one the chosen module reads: rl_speed's own modules declare the
    keys they read (``model_config_keys``: key -> None for any value, or the values the module implements), and a key
    they do not read would change nothing, silently (RLlib's ``conv_filters`` on the Nature CNN, say). A module may
    add rules between keys or on the algorithm's config (a ``check_model_config(given, config)`` of its own).
    RLlib's modules and a user's own (a class that does not declare its keys itself, a subclass of ours included)
    read what they read and are not checked."""
    for module_class, given in modules_and_model_configs(config):
        declared = module_class.__dict__.get("model_config_keys")
        if declared is None:
            continue
        label = module_class.__name__
        unknown = sorted(set(given) - set(declared))
        if unknown:
            config._value_error(f"{name}: `model_config` keys {unknown} are not read by {label}, so they would "
                                f"change nothing; it reads {', '.join(declared)}. Remove them, or use a module that "
                                "reads them (RLlib's default module reads RLlib's keys).")
        for key, values in declared.items():
            if values is not None and key in given and given[key] not in values:
                config._value_error(f"{name}: `model_config.{key}`={given[key]!r} is not what {label} implements "
                                    f"({' or '.join(map(repr, values))}); remove the key or set it so.")
        has_rule = "check_model_config" in module_class.__dict__
        problem = module_class.check_model_config(given, config) if has_rule else None
        if problem:
            config._value_error(f"{name}: {label}: {problem}")


def modules_and_model_configs(config: Any) -> list[tuple[type, dict]]:
    """(module class, the ``model_config`` keys the user set for it) for the config's module(s). A module spec's own
    ``model_config`` replaces the config's, as RLlib builds it; since such a dict is often a copy of the algorithm's
    whole ``config.model_config`` (RLlib's own default DQN spec is built so), its keys that hold the algorithm's own
    defaults (``_model_config_auto_includes``, ``DefaultModelConfig``'s) are not counted as the user's."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec

    spec = config._rl_module_spec
    if spec is None or (getattr(spec, "module_class", None) is None and not isinstance(spec, MultiRLModuleSpec)):
        try:
            spec = config.get_default_rl_module_spec()
        except NotImplementedError:  # (an algorithm without a default module: nothing to check)
            return []
    specs = [spec]
    if isinstance(spec, MultiRLModuleSpec):
        inner = spec.rl_module_specs
        specs = list(inner.values()) if isinstance(inner, dict) else [inner] if inner is not None else []
    defaults = {**_default_model_config(), **config._model_config_auto_includes}
    return [(s.module_class, _user_keys(config._model_config) if s.model_config is None else
             {key: value for key, value in _user_keys(s.model_config).items()
              if not (key in defaults and defaults[key] == value)})
            for s in specs if isinstance(getattr(s, "module_class", None), type)]


def _default_model_config() -> dict:
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return dataclasses.asdict(DefaultModelConfig())


def _user_keys(model_config: Any) -> dict:
    """The keys a user set: a dict as given, or a ``DefaultModelConfig``'s fields that differ from its defaults
    (RLlib's algorithm-level defaults, such as PPO's ``vf_share_layers``, are added later and are not the user's)."""
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if model_config is None:
        return {}
    if isinstance(model_config, DefaultModelConfig):
        defaults = _default_model_config()
        return {key: value for key, value in dataclasses.asdict(model_config).items() if value != defaults[key]}
    return dict(model_config)
