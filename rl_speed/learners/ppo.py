"""PPO learners.

* :class:`VectorizedGAEPPOTorchLearner`: stock PPO's learner with rl_speed's VectorizedGAE in place of RLlib's
  GeneralAdvantageEstimation (``config.learners(learner_class=...)``; everything else is RLlib's PPO).
* :class:`FastPPOTorchLearner`: FastPPO's learner. It takes ``[T, N]`` column batches (see :mod:`rl_speed.columns`)
  instead of episodes: one value forward pass over all ``(T + 1) * N`` observations, GAE over ``[T, N]`` on the
  learner's device (:func:`rl_speed.gae.vectorized_gae`), then ``num_epochs`` passes of minibatches
  gathered from the flattened columns, each through RLlib's ``_update`` (PPO's loss, KL-coefficient and entropy
  schedules unchanged) in :class:`rl_speed.learners.update_loop.UpdateLoopMixin`'s loop. Reset steps stay in the
  batch with ``loss_mask`` False, so every learner of a DDP group gets the same number of rows and runs the same
  number of minibatches.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
import torch
import tree

from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
from ray.rllib.core import ALL_MODULES
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rl_speed import columns as C
from rl_speed.columns import IS_FIRST
from rl_speed.connectors.vectorized_gae import VectorizedGAE
from rl_speed.gae import standardize, vectorized_gae
from rl_speed.learners.optimizer_step import OptimizerStepMixin
from rl_speed.learners.ppo_loss import PPO_LOSS_KEY, ppo_loss
from rl_speed.learners.sequences import EpisodeSequences
from rl_speed.learners.update_loop import LossRows, UpdateLoopMixin, keeps_input_statistics

#: Learner result key (under ``__all_modules__``): seconds spent joining the runners' batches on the device, then
#: on values + GAE, in the last update call.
ADVANTAGES_TIME_KEY = "advantages_time_s"
#: Learner result key: the join's share of :data:`ADVANTAGES_TIME_KEY` (reading the batches from the object store
#: and copying them to the device), apart from the values forward and GAE that follow.
JOIN_TIME_KEY = "join_time_s"


def to_device(x: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A column array as a tensor on the learner's device (tensors already joined there pass through)."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    with warnings.catch_warnings():  # arrays from Ray's object store are read-only; nothing writes to them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(x)).to(device, non_blocking=True)


def join_lanes_on_device(batches: list[dict], device: torch.device) -> dict:
    """Several runners' column batches as one batch of tensors on ``device``, joined along the lane axis: each array
    is copied to the device once and joined there (the host never builds the joined batch)."""
    if len(batches) == 1:
        return tree.map_structure(lambda x: to_device(x, device), batches[0])
    C.check_same_length(batches, "FastPPO")
    return tree.map_structure(lambda *xs: torch.cat([to_device(x, device) for x in xs], dim=1), *batches)


def update_statistics(module: Any, obs: Any, rows: torch.Tensor) -> None:
    """Hands a module that keeps input statistics (:func:`keeps_input_statistics`) the observations ``[T + 1, N,
    ...]`` of a train batch's real steps (``rows`` ``[T, N]``); for other modules nothing is selected (no copy, no
    device sync)."""
    if keeps_input_statistics(module) and rows.any():
        module.update_input_statistics(tree.map_structure(lambda o: o[:-1][rows], obs))


def value_statistics(module: Any) -> Any:
    """The running statistics of the value targets a module's value head is trained in, or None: its ``value_norm``
    (a :class:`rl_speed.modules.layers.RunningNorm` of one number) where ``keeps_value_statistics`` is true, e.g.
    NatureActorCritic's ``normalize_value``. Learners that update them set ``updates_value_statistics = True``, which
    such modules check at config time."""
    return module.value_norm if getattr(module, "keeps_value_statistics", False) else None


def replace_gae_connector(learner: PPOTorchLearner, gae_class: type) -> None:
    """Swaps RLlib's GeneralAdvantageEstimation at the end of a built PPO learner's pipeline for ``gae_class`` (same
    constructor), where the pipeline has RLlib's default pieces (a user's own pipeline is left as it is)."""
    if learner._learner_connector is not None and learner.config.add_default_connectors_to_learner_pipeline:
        learner._learner_connector.remove(GeneralAdvantageEstimation)
        learner._learner_connector.append(gae_class(gamma=learner.config.gamma, lambda_=learner.config.lambda_))


class VectorizedGAEPPOTorchLearner(PPOTorchLearner):
    """RLlib's PPOTorchLearner whose learner pipeline ends with VectorizedGAE."""

    @override(PPOTorchLearner)
    def build(self) -> None:
        super().build()
        replace_gae_connector(self, VectorizedGAE)


def written_by_module(value_batch: dict, obs: Any, rows: int) -> dict:
    """What a module's ``compute_values`` wrote into the batch it was given, cut to the first ``rows`` rows (the
    steps; the rest are the bootstrap observations).

    RLlib's GAE connector calls ``compute_values`` on the training batch itself, so a module may reshape its batch
    there for its ``_forward_train`` (RLlib's action-masking example moves the mask out of the Dict observation into
    ``batch["action_mask"]`` and replaces the observation by its ``"observations"`` part). The same happens here:
    a key the module added or replaced goes into the training batch."""
    out = {}
    for key, value in value_batch.items():
        if key == RLlibColumns.OBS and value is obs and not isinstance(obs, dict):
            continue  # untouched: the training batch already has these observations
        out[key] = tree.map_structure(lambda x: x[:rows], value)
    return out


#: A loss-rows key: the minibatch is a placeholder whose loss counts zero
#: (:meth:`FastPPOTorchLearner.placeholder_rows`).
PLACEHOLDER = "rl_speed_placeholder"


class FastPPOTorchLearner(UpdateLoopMixin, OptimizerStepMixin, PPOTorchLearner):
    """PPO's loss on column batches; episode batches still take RLlib's path (see the module docstring)."""

    time_updates = True  # one update() call is a whole train batch: its minibatch loop is timed (UPDATES_TIME_KEY)
    #: It updates a module's input statistics (rl_speed.learners.update_loop.keeps_input_statistics) with each train
    #: batch's real steps, before their values (NatureActorCritic's ``normalize_obs``; checked at config time).
    updates_input_statistics = True
    #: It converts a module's values to returns' units for GAE and folds each train batch's value targets into the
    #: module's value statistics (:func:`value_statistics`; NatureActorCritic's ``normalize_value``).
    updates_value_statistics = True

    @override(UpdateLoopMixin)
    def prepare_columns(self, batches: list[dict], minibatch_size: int | None) -> list[LossRows]:
        start = time.perf_counter()
        columns = join_lanes_on_device(batches, self._device)
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)  # the copies are done, so the join's time is theirs
        joined = time.perf_counter()
        if C.MODULE in columns:
            per_module = self.compute_multi_agent_advantages(columns)
        else:
            module_id = next(iter(self.module.keys()))
            per_module = {module_id: self.compute_advantages(module_id, columns)}
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)  # one sync per call, so the timing below means something
        self.metrics.log_value((ALL_MODULES, ADVANTAGES_TIME_KEY), time.perf_counter() - start, window=1)
        self.metrics.log_value((ALL_MODULES, JOIN_TIME_KEY), joined - start, window=1)
        env_steps = C.num_env_steps(columns)
        out = []
        for module_id, flat in per_module.items():
            mask = flat[RLlibColumns.LOSS_MASK]
            size = len(mask)  # rows: steps, or bptt chunks of recurrent modules
            if not size:
                continue
            steps_per_row = mask[0].numel()
            minibatch_rows = max(1, min((minibatch_size or mask.numel()) // steps_per_row, size))
            out.append(LossRows(module_id, flat, minibatch_rows, int(mask.sum()), env_steps))
        return out

    def entropy_coeff(self, module_id: str) -> Any:
        """The loss's entropy coefficient: RLlib's scheduler value, or with a captured step a device tensor that
        :meth:`after_gradient_based_update` sets in place (RLlib's scheduler swaps its tensor's storage, which a
        replayed graph would not see)."""
        value = self.entropy_coeff_schedulers_per_module[module_id].get_current_value()
        if self._step_graphs is None:
            return value
        coeffs = self.__dict__.setdefault("_entropy_coeffs_on_device", {})
        if module_id not in coeffs:
            coeffs[module_id] = torch.tensor(float(value), device=self._device)
        return coeffs[module_id]

    @override(PPOTorchLearner)
    def after_gradient_based_update(self, *, timesteps: dict) -> None:
        super().after_gradient_based_update(timesteps=timesteps)  # RLlib's schedules move (lr, entropy, KL)
        for module_id, coeff in getattr(self, "_entropy_coeffs_on_device", {}).items():
            coeff.fill_(float(self.entropy_coeff_schedulers_per_module[module_id].get_current_value()))

    @override(UpdateLoopMixin)
    def placeholder_rows(self, module_id: str) -> LossRows:
        """One row of ``module_id`` from its spaces (an observation and an action drawn from them, the module's own
        logits), marked :data:`PLACEHOLDER`: :meth:`compute_loss_for_module` counts its loss zero. The forward and
        backward still run, so this learner takes part in the module's DDP all-reduce (see
        :class:`UpdateLoopMixin`)."""
        module = self.module[module_id].unwrapped()
        device = self._device

        def drawn(space: Any) -> Any:
            return tree.map_structure(lambda x: torch.as_tensor(np.asarray(x)[None], device=device), space.sample())

        obs = drawn(module.observation_space)
        with torch.no_grad():
            logits = module.forward_train({RLlibColumns.OBS: obs})[RLlibColumns.ACTION_DIST_INPUTS]
        zero = torch.zeros(1, device=device)
        one = torch.ones(1, dtype=torch.bool, device=device)
        batch = {RLlibColumns.OBS: obs, RLlibColumns.ACTIONS: drawn(module.action_space),
                 RLlibColumns.ACTION_LOGP: zero, RLlibColumns.ACTION_DIST_INPUTS: logits,
                 RLlibColumns.VF_PREDS: zero, Postprocessing.ADVANTAGES: zero, Postprocessing.VALUE_TARGETS: zero,
                 RLlibColumns.LOSS_MASK: one, PLACEHOLDER: one}
        return LossRows(module_id, batch, 1, 0, 0)

    @override(PPOTorchLearner)
    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict, fwd_out: dict) -> torch.Tensor:
        if PLACEHOLDER not in batch:
            return self._ppo_loss(module_id, config, batch, fwd_out)
        metrics, self.metrics = self.metrics, MetricsLogger()  # statistics of no data: not logged
        try:
            return 0.0 * self._ppo_loss(module_id, config, batch, fwd_out)
        finally:
            self.metrics = metrics

    def _ppo_loss(self, module_id: str, config: Any, batch: dict, fwd_out: dict) -> torch.Tensor:
        """RLlib's PPO loss without its device-to-host syncs (:mod:`rl_speed.learners.ppo_loss`), or RLlib's own
        method where ``learner_config_dict`` asks for it."""
        if self.config.learner_config_dict.get(PPO_LOSS_KEY, "sync_free") == "rllib":
            return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        return ppo_loss(self, module_id, config, batch, fwd_out)

    @torch.no_grad()
    def compute_multi_agent_advantages(self, columns: dict) -> dict[str, dict]:
        """Multi-agent columns -> one training batch per module to train (feed-forward modules): each lane's values
        from the module that owns its observations (``module`` column), GAE over all ``[T, L]`` lanes at once, then
        each module's rows, its advantages standardized over its own steps (as RLlib's GAE connector does per
        module). A single module (a shared policy) owns every lane: that is the single-agent layout."""
        device = self._device

        def tensor(x: np.ndarray) -> torch.Tensor:
            return to_device(x, device)

        module_ids = sorted(self.module.keys())  # the runner's indices refer to this order
        if len(module_ids) == 1:  # one module owns every lane (a shared policy): the single-module path, no gathers
            return {module_ids[0]: self.compute_advantages(module_ids[0], columns)} \
                if self.should_module_be_updated(module_ids[0]) else {}
        with_value_statistics = [m for m in module_ids if value_statistics(self.module[m].unwrapped()) is not None]
        if with_value_statistics:  # (refused at config time where RLlib's `policies` name the modules)
            raise ValueError(f"FastPPO: `normalize_value` on module(s) {with_value_statistics} among "
                             f"{len(module_ids)} modules; value statistics are kept for one module only. Remove the "
                             "key or train one module.")
        owner = tensor(columns[C.MODULE]).long()  # [T + 1, L]
        by_module = C.BY_MODULE in columns  # agents with different spaces: each module's data in its own columns

        def of(key: str, module_id: str) -> Any:
            return columns[key][module_id] if by_module else columns[key]

        obs = ({mid: tree.map_structure(tensor, columns[C.OBS][mid]) for mid in module_ids} if by_module
               else tree.map_structure(tensor, columns[C.OBS]))  # [T + 1, L, ...]
        rewards = tensor(columns[C.REWARDS])
        valid = tensor(columns[C.VALID])
        for index, module_id in enumerate(module_ids):
            if self.should_module_be_updated(module_id):
                update_statistics(self.module[module_id].unwrapped(), obs[module_id] if by_module else obs,
                                  (owner[:-1] == index) & valid)
        values = torch.zeros(owner.shape, device=device)
        for index, module_id in enumerate(module_ids):
            where = owner == index
            # Only modules that train need values (a heuristic module beside them, e.g. RLlib's RandomRLModule, has
            # none); the other lanes' advantages are never read.
            if self.should_module_be_updated(module_id) and where.any():
                module = self.module[module_id].unwrapped()
                mine = obs[module_id] if by_module else obs
                values[where] = module.compute_values(
                    {RLlibColumns.OBS: tree.map_structure(lambda o: o[where], mine)}).float()
        next_row = tensor(columns[C.NEXT_ROW]) if C.NEXT_ROW in columns else None
        advantages, targets = vectorized_gae(values, rewards, tensor(columns[C.TERMINATEDS]),
                                             tensor(columns[C.TRUNCATEDS]), valid, gamma=self.config.gamma,
                                             lambda_=self.config.lambda_, next_row=next_row)
        batches = {}
        for index, module_id in enumerate(module_ids):
            if not self.should_module_be_updated(module_id):
                continue  # policies_to_train: the module acts, but is not trained
            rows = (owner[:-1] == index) & valid  # its steps; nothing else of its lanes is trained on
            if not rows.any():
                continue
            batches[module_id] = {
                RLlibColumns.OBS: tree.map_structure(lambda o: o[:-1][rows], obs[module_id] if by_module else obs),
                RLlibColumns.ACTIONS: tree.map_structure(lambda a: tensor(a)[rows], of(C.ACTIONS, module_id)),
                RLlibColumns.ACTION_LOGP: tensor(of(C.ACTION_LOGP, module_id))[rows],
                RLlibColumns.ACTION_DIST_INPUTS: tensor(of(C.ACTION_DIST_INPUTS, module_id))[rows],
                RLlibColumns.VF_PREDS: values[:-1][rows],
                Postprocessing.ADVANTAGES: standardize(advantages[rows], torch.ones_like(rows[rows]), min_std=1e-4),
                Postprocessing.VALUE_TARGETS: targets[rows],
                RLlibColumns.LOSS_MASK: torch.ones(int(rows.sum()), dtype=torch.bool, device=device),
            }
        return batches

    @torch.no_grad()
    def compute_advantages(self, module_id: str, columns: dict) -> dict:
        """Columns -> the training batch PPO's loss reads (tensors on the learner's device): rows are single steps
        ``[T * N]`` for feed-forward modules, chunks of ``bptt_horizon`` steps ``[T / L * N, L]`` for rl_speed's
        recurrent module (with ``state_in`` at each chunk's start and ``is_first``), or RLlib's padded sequences
        ``[S, L]`` for RLlib's own stateful modules (:class:`rl_speed.learners.sequences.EpisodeSequences`)."""
        device = self._device
        module = self.module[module_id].unwrapped()

        def tensor(x: np.ndarray) -> torch.Tensor:
            return to_device(x, device)

        obs = tree.map_structure(tensor, columns[C.OBS])  # [T + 1, N, ...]
        rewards = tensor(columns[C.REWARDS])
        t_len, n = rewards.shape
        update_statistics(module, obs, tensor(columns[C.VALID]))
        recurrent = C.STATE_IN in columns
        if module.is_stateful() and not recurrent:
            raise ValueError("FastPPO: a recurrent module needs `state_in` / `is_first` columns; sample with "
                             "rl_speed's BatchedEnvRunner.")
        sequences = None
        if recurrent and not getattr(module, "resets_state_at_is_first", False):
            # RLlib's own stateful module (use_lstm): RLlib's padded sequence layout, cut at episode starts.
            chunks = len(tree.flatten(columns[C.STATE_IN])[0])
            sequences = EpisodeSequences(tensor(columns[C.IS_FIRST]), t_len // chunks)
            rows = sequences.gather
            state_in = sequences.state_in(tree.map_structure(tensor, columns[C.STATE_IN]))
            keep = tensor(columns[C.VALID][-1]).float()  # obs[T] starts an episode after a reset step: zeros
            final = tree.map_structure(lambda s: tensor(s)[0] * keep.reshape(-1, *([1] * (s.ndim - 2))),
                                       columns[C.STATE_OUT])
            step_values = sequences.scatter(module.compute_values(
                {RLlibColumns.OBS: tree.map_structure(lambda o: rows(o[:-1]), obs), RLlibColumns.STATE_IN: state_in}))
            bootstrap = module.compute_values({RLlibColumns.OBS: tree.map_structure(lambda o: o[-1][:, None], obs),
                                               RLlibColumns.STATE_IN: final})
            values = torch.cat([step_values, bootstrap.reshape(1, n)])
        elif recurrent:
            chunks = len(tree.flatten(columns[C.STATE_IN])[0])
            horizon = t_len // chunks

            def rows(x: torch.Tensor) -> torch.Tensor:  # [T, N, ...] -> [K * N, L, ...], chunk-major
                x = x.reshape(chunks, horizon, n, *x.shape[2:]).transpose(1, 2)
                return x.reshape(chunks * n, horizon, *x.shape[3:])

            state_in = tree.map_structure(lambda s: tensor(s).reshape(chunks * n, *s.shape[2:]),
                                          columns[C.STATE_IN])
            is_first = tensor(columns[C.IS_FIRST])
            values = self._recurrent_values(module, obs, rows(is_first), state_in, rows, chunks, horizon,
                                            tensor(~columns[C.VALID][-1]))
        else:
            def rows(x: torch.Tensor) -> torch.Tensor:  # [T, N, ...] -> [T * N, ...]
                return x.reshape(t_len * n, *x.shape[2:])

            flat_obs = tree.map_structure(lambda o: o.reshape(-1, *o.shape[2:]), obs)  # [(T + 1) * N, ...]
            value_batch = {RLlibColumns.OBS: flat_obs}
            values = module.compute_values(value_batch).reshape(t_len + 1, n)
        valid = tensor(columns[C.VALID])
        next_row = tensor(columns[C.NEXT_ROW]) if C.NEXT_ROW in columns else None  # (turn-based, a shared policy)
        value_norm = value_statistics(module)
        if value_norm is not None:  # the head predicts standardized returns: GAE needs returns' units
            values = value_norm.denormalize(values)
        advantages, targets = vectorized_gae(values, rewards, tensor(columns[C.TERMINATEDS]),
                                             tensor(columns[C.TRUNCATEDS]), valid, gamma=self.config.gamma,
                                             lambda_=self.config.lambda_, next_row=next_row)
        if value_norm is not None:  # fold the real steps' targets in, then train the head on them standardized
            value_norm.update(targets[valid])
            targets, values = value_norm(targets), value_norm(values)
        # As RLlib's GeneralAdvantageEstimation: standardized over the learner's batch (population std, floored at
        # 1e-4), but over real steps only.
        advantages = standardize(advantages, valid, min_std=1e-4)

        batch = {
            RLlibColumns.OBS: tree.map_structure(lambda o: rows(o[:-1]), obs),
            RLlibColumns.ACTIONS: tree.map_structure(lambda a: rows(tensor(a)), columns[C.ACTIONS]),
            RLlibColumns.ACTION_LOGP: rows(tensor(columns[C.ACTION_LOGP])),
            RLlibColumns.ACTION_DIST_INPUTS: rows(tensor(columns[C.ACTION_DIST_INPUTS])),
            RLlibColumns.VF_PREDS: rows(values[:-1]),
            Postprocessing.ADVANTAGES: rows(advantages),
            Postprocessing.VALUE_TARGETS: rows(targets),
            RLlibColumns.LOSS_MASK: rows(valid),
        }
        if not recurrent:
            batch.update(written_by_module(value_batch, flat_obs, t_len * n))
        if sequences is not None:
            batch[RLlibColumns.STATE_IN] = state_in
            batch[RLlibColumns.LOSS_MASK] = batch[RLlibColumns.LOSS_MASK] & ~sequences.pad
        elif recurrent:
            batch[RLlibColumns.STATE_IN] = state_in
            batch[IS_FIRST] = rows(is_first)
        return batch

    @staticmethod
    def _recurrent_values(module: Any, obs: Any, is_first: torch.Tensor, state_in: dict, rows: Any, chunks: int,
                          horizon: int, last_is_first: torch.Tensor) -> torch.Tensor:
        """``[T + 1, N]`` values from the chunks (each starting from the runner's recorded state) plus one step for
        the bootstrap observation ``obs[T]`` from the state the last chunk ends in."""
        n = last_is_first.shape[0]
        out = module._forward({RLlibColumns.OBS: tree.map_structure(lambda o: rows(o[:-1]), obs),
                               RLlibColumns.STATE_IN: state_in, IS_FIRST: is_first})
        values = module.compute_values({}, embeddings=out[RLlibColumns.EMBEDDINGS])  # [K * N, L]
        values = values.reshape(chunks, n, horizon).transpose(1, 2).reshape(chunks * horizon, n)
        keep = (~last_is_first).float()[:, None]
        final = tree.map_structure(lambda s: s[-n:] * keep, out[RLlibColumns.STATE_OUT])
        last = tree.map_structure(lambda o: o[-1], obs)
        bootstrap = module.compute_values({}, embeddings=module._forward(
            {RLlibColumns.OBS: last, RLlibColumns.STATE_IN: final})[RLlibColumns.EMBEDDINGS])
        return torch.cat([values, bootstrap[None]])
