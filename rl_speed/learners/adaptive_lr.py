"""A learning rate that follows the policy's KL divergence, minibatch by minibatch (FastPPO's ``lr_kl_target``).

After every optimizer step the learning rate moves by one rule (rl_games' "adaptive" schedule, which its PPO
presets use on Atari): if the minibatch's KL divergence between the behaviour policy and the policy being trained
was above twice the target, the lr is divided by 1.5; if it was below half the target, the lr is multiplied by 1.5;
it stays within [1e-6, 1e-2]. The KL is the one of the minibatch's forward pass, before the step (the exact KL of
the two action distributions, ``behaviour.kl(current)``, averaged over the minibatch's real rows).

Why: a fixed lr is either timid early (PPO's clip is rarely reached) or too bold late; the rule raises the lr while
updates barely move the policy and lowers it when they move it too far. On Pong it is what lets rl_games' preset
reach a score of 18 in about a million env steps.

Everything happens on the learner's device: the lr is Adam's tensor lr, rewritten in place with ``torch.where``,
so there is no device-to-host sync, and a captured CUDA graph (``cuda_graph: true``) holds the rule and replays it.
"""

from __future__ import annotations

import torch

#: The factor of each move, and the bounds (rl_games' AdaptiveScheduler).
FACTOR = 1.5
MIN_LR = 1e-6
MAX_LR = 1e-2


def adapt_lr_(lr: torch.Tensor, kl: torch.Tensor, target: float) -> None:
    """Moves the tensor ``lr`` in place by the rule above, given the minibatch's mean KL ``kl`` (a 0-dim tensor on
    the same device). A non-finite KL leaves the lr as it is."""
    lowered = torch.clamp(lr / FACTOR, min=MIN_LR)
    raised = torch.clamp(lr * FACTOR, max=MAX_LR)
    lr.copy_(torch.where(kl > 2.0 * target, lowered, torch.where(kl < 0.5 * target, raised, lr)))
