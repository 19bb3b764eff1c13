"""PPO learners.

* :class:`VectorizedGAEPPOTorchLearner`: stock PPO's learner with rl_speed's VectorizedGAE in place of RLlib's
  GeneralAdvantageEstimation (``config.learners(learner_class=...)``; everything else is RLlib's PPO).
* :class:`FastPPOTorchLearner`: FastPPO's learner. It takes ``[T, N]`` column batches (see :mod:`rl_speed.columns`)
  instead of episodes: one value forward pass over all ``(T + 1) * N`` observations, GAE over ``[T, N]`` on the
  learner's device (:func:`rl_speed.connectors.gae.vectorized_gae`), then ``num_epochs`` passes of minibatches
  gathered from the flattened columns, each through RLlib's ``_update`` (PPO's loss, KL-coefficient and entropy
  schedules unchanged). Reset steps stay in the batch with ``loss_mask`` False, so every learner of a DDP group gets
  the same number of rows and runs the same number of minibatches.
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

from rl_speed.connectors.gae import standardize, vectorized_gae
from rl_speed.connectors.gae_connector import VectorizedGAE
from rl_speed.learners.train_step import TrainStepMixin
from rl_speed.modules.recurrent import IS_FIRST

#: Learner result key (under ``__all_modules__``): seconds spent on values + GAE in the last update call.
ADVANTAGES_TIME_KEY = "advantages_time_s"


class VectorizedGAEPPOTorchLearner(PPOTorchLearner):
    """RLlib's PPOTorchLearner whose learner pipeline ends with VectorizedGAE."""

    def build(self) -> None:
        super().build()
        if self._learner_connector is not None and self.config.add_default_connectors_to_learner_pipeline:
            self._learner_connector.remove(GeneralAdvantageEstimation)
            self._learner_connector.append(VectorizedGAE(gamma=self.config.gamma, lambda_=self.config.lambda_))


def is_column_batch(batch: Any) -> bool:
    return isinstance(batch, dict) and "valid" in batch and "rewards" in batch


class FastPPOTorchLearner(TrainStepMixin, PPOTorchLearner):
    """PPO's loss on column batches; episode batches still take RLlib's path (see the module docstring)."""

    def update(self, *args: Any, training_data: Any = None, timesteps: dict | None = None, num_epochs: int = 1,
               minibatch_size: int | None = None, shuffle_batch_per_epoch: bool = False, **kwargs: Any) -> Any:
        if training_data is None or not is_column_batch(training_data.batch):
            return super().update(*args, training_data=training_data, timesteps=timesteps, num_epochs=num_epochs,
                                  minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch,
                                  **kwargs)
        return self.update_from_columns(training_data.batch, timesteps=timesteps or {}, num_epochs=num_epochs,
                                        minibatch_size=minibatch_size, shuffle=shuffle_batch_per_epoch)

    def update_from_columns(self, columns: dict, *, timesteps: dict, num_epochs: int, minibatch_size: int | None,
                            shuffle: bool) -> dict:
        self._check_is_built()
        if len(self.module) != 1:
            raise ValueError("FastPPO's column batches are single-module; multi-agent envs take the batched "
                             "(agents-as-lanes) form, whose agents share one policy.")
        module_id = next(iter(self.module.keys()))
        self.before_gradient_based_update(timesteps=timesteps)
        self._weights_seq_no += 1

        start = time.perf_counter()
        flat = self.compute_advantages(module_id, columns)
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)  # one sync per call, so the timing below means something
        self.metrics.log_value((ALL_MODULES, ADVANTAGES_TIME_KEY), time.perf_counter() - start, window=1)

        mask = flat[RLlibColumns.LOSS_MASK]
        size = len(mask)  # rows: steps, or bptt chunks of recurrent modules
        steps_per_row = mask[0].numel()
        minibatch_size = max(1, min((minibatch_size or mask.numel()) // steps_per_row, size))
        num_minibatches = -(-size // minibatch_size)
        loss_per_module: dict = {}
        for epoch in range(num_epochs):
            order = torch.randperm(size, device=self._device) if shuffle else None
            for i in range(num_minibatches):
                self.is_last_minibatch = epoch == num_epochs - 1 and i == num_minibatches - 1
                rows = slice(i * minibatch_size, (i + 1) * minibatch_size)
                index = order[rows] if order is not None else rows
                minibatch = tree.map_structure(lambda x: x[index], flat)
                _, loss_per_module, _ = self._update({module_id: minibatch})
        self.is_last_minibatch = True
        valid_steps = int(columns["valid"].sum())
        self._log_lean_update(module_id, valid_steps * num_epochs, valid_steps * num_epochs, loss_per_module)
        self.after_gradient_based_update(timesteps=timesteps)
        return self.metrics.reduce()

    @torch.no_grad()
    def compute_advantages(self, module_id: str, columns: dict) -> dict:
        """Columns -> the training batch PPO's loss reads (tensors on the learner's device): rows are single steps
        ``[T * N]`` for feed-forward modules, or chunks of ``bptt_horizon`` steps ``[T / L * N, L]`` for recurrent
        ones (with ``state_in`` at each chunk's start and ``is_first``)."""
        device = self._device
        module = self.module[module_id].unwrapped()

        def tensor(x: np.ndarray) -> torch.Tensor:
            with warnings.catch_warnings():  # arrays from Ray's object store are read-only; nothing writes to them
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(np.ascontiguousarray(x)).to(device, non_blocking=True)

        obs = tree.map_structure(tensor, columns["obs"])  # [T + 1, N, ...]
        rewards = tensor(columns["rewards"])
        t_len, n = rewards.shape
        recurrent = "state_in" in columns
        if module.is_stateful() and not recurrent:
            raise ValueError("FastPPO: a recurrent module needs `state_in` / `is_first` columns; sample with "
                             "rl_speed's BatchedEnvRunner.")
        if recurrent:
            chunks = len(tree.flatten(columns["state_in"])[0])
            horizon = t_len // chunks

            def rows(x: torch.Tensor) -> torch.Tensor:  # [T, N, ...] -> [K * N, L, ...], chunk-major
                x = x.reshape(chunks, horizon, n, *x.shape[2:]).transpose(1, 2)
                return x.reshape(chunks * n, horizon, *x.shape[3:])

            state_in = tree.map_structure(lambda s: tensor(s).reshape(chunks * n, -1), columns["state_in"])
            is_first = tensor(columns["is_first"])
            values = self._recurrent_values(module, obs, rows(is_first), state_in, rows, chunks, horizon,
                                            tensor(~columns["valid"][-1]))
        else:
            def rows(x: torch.Tensor) -> torch.Tensor:  # [T, N, ...] -> [T * N, ...]
                return x.reshape(t_len * n, *x.shape[2:])

            flat_obs = tree.map_structure(lambda o: o.reshape(-1, *o.shape[2:]), obs)
            values = module.compute_values({RLlibColumns.OBS: flat_obs}).reshape(t_len + 1, n)
        valid = tensor(columns["valid"])
        advantages, targets = vectorized_gae(values, rewards, tensor(columns["terminateds"]),
                                             tensor(columns["truncateds"]), valid, gamma=self.config.gamma,
                                             lambda_=self.config.lambda_)
        # As RLlib's GeneralAdvantageEstimation: standardized over the learner's batch (population std, floored at
        # 1e-4), but over real steps only.
        advantages = standardize(advantages, valid, min_std=1e-4)

        batch = {
            RLlibColumns.OBS: tree.map_structure(lambda o: rows(o[:-1]), obs),
            RLlibColumns.ACTIONS: tree.map_structure(lambda a: rows(tensor(a)), columns["actions"]),
            RLlibColumns.ACTION_LOGP: rows(tensor(columns["action_logp"])),
            RLlibColumns.ACTION_DIST_INPUTS: rows(tensor(columns["action_dist_inputs"])),
            RLlibColumns.VF_PREDS: rows(values[:-1]),
            Postprocessing.ADVANTAGES: rows(advantages),
            Postprocessing.VALUE_TARGETS: rows(targets),
            RLlibColumns.LOSS_MASK: rows(valid),
        }
        if recurrent:
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
