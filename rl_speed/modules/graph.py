"""GraphActorCritic: a message-passing actor-critic RLModule for padded graph observations (durotaxis).

Input (see :mod:`rl_speed_envs.durotaxis`): ``nodes [B, M, F]``, ``edges [B, E, 2]`` (slot pairs, real rows first),
``node_mask [B, M]``, ``edge_mask [B, E]``. Network, in plain torch:

1. node encoder: MLP on each node's features, zeroed at padded slots;
2. ``num_layers`` rounds of message passing over the edges in both directions: each node averages its
   neighbours' embeddings and mixes the average with its own (:func:`mean_adjacency` scatters the padded, masked
   edge list into a normalized adjacency once per forward; each round is then one batched matmul);
3. graph embedding: masked mean and max of the node embeddings plus the node count / M;
4. heads: per node (node embedding + graph embedding) -> spawn logit and the two spawn-parameter means; graph
   embedding -> delete-ratio mean; state-independent log-stds; a value MLP on the graph embedding.

The heads feed :class:`rl_speed.modules.hybrid_distribution.HybridGraphDistribution` (closed-form log-prob, entropy
and KL over the hybrid action, masked by ``node_mask``). model_config: ``hidden`` (64), ``num_layers`` (2),
``init_delete_mean`` (-0.8: with RLlib's ``normalize_actions`` the delete ratio is ``(a + 1) / 2``, so the policy
starts by deleting about 10% of its nodes, not 50%).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override

from rl_speed.modules.hybrid_distribution import HybridGraphDistribution, pack_inputs
from rl_speed.modules.layers import mlp

OBS_KEYS = ("nodes", "edges", "node_mask", "edge_mask")


class MessagePassing(nn.Module):
    """One round: ``h_i <- relu(W_self h_i + W_nb mean_{j ~ i} h_j)`` at real nodes; ``mean_adjacency`` is the
    row-normalized ``[B, M, M]`` adjacency, so the neighbour mean of all nodes is one batched matmul."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.self_weight = nn.Linear(hidden, hidden)
        self.neighbour_weight = nn.Linear(hidden, hidden, bias=False)

    def forward(self, h: torch.Tensor, mean_adjacency: torch.Tensor, node_mask: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.self_weight(h) + self.neighbour_weight(mean_adjacency @ h)) * node_mask


def mean_adjacency(edges: torch.Tensor, edge_mask: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``[B, M, M]`` row-normalized adjacency from the padded edge list: a scatter of the edge mask (padded rows add
    0) at ``(i, j)`` and ``(j, i)``, then each row divided by its degree.

    Why dense: with M = 24 slots a graph has up to 276 edges (about 60 in practice). The sparse form, gathering a
    ``[2E, H]`` message table over the real edges and ``index_add``-ing it back, moved about 65 MB per layer at
    B = 2048 and made a whole training step (forward, backward, Adam) 1.8x slower on CPU (0.33 s against 0.18 s);
    its ``nonzero`` (to drop padded edges) also forces a GPU-to-host sync. For graphs of hundreds of slots the
    sparse form would win again."""
    b = edges.shape[0]
    i, j = edges[..., 0].long(), edges[..., 1].long()
    weight = edge_mask.to(torch.float32)
    adjacency = torch.zeros(b, num_nodes * num_nodes, device=edges.device)
    adjacency.scatter_add_(1, i * num_nodes + j, weight).scatter_add_(1, j * num_nodes + i, weight)
    adjacency = adjacency.view(b, num_nodes, num_nodes)
    return adjacency / adjacency.sum(-1, keepdim=True).clamp(min=1.0)


class GraphActorCritic(TorchRLModule, ValueFunctionAPI):
    """See the module docstring."""

    #: What it reads from model_config (checked at config time); its heads share the message passing.
    model_config_keys = {"hidden": None, "num_layers": None, "init_delete_mean": None, "vf_share_layers": (True,)}

    @override(TorchRLModule)
    def setup(self) -> None:
        cfg = self.model_config or {}
        obs, action = self.observation_space, self.action_space
        if not isinstance(obs, gym.spaces.Dict) or set(obs.spaces) != set(OBS_KEYS):
            raise ValueError(f"GraphActorCritic: observations must be a Dict with keys {OBS_KEYS}, got {obs}.")
        if not isinstance(action, gym.spaces.Dict) or set(action.spaces) != {"spawn", "spawn_params",
                                                                              "delete_ratio"}:
            raise ValueError(f"GraphActorCritic: actions must be the durotaxis Dict (spawn, spawn_params, "
                             f"delete_ratio), got {action}.")
        hidden = int(cfg.get("hidden", 64))
        features = obs["nodes"].shape[-1]
        self.encoder, _ = mlp(features, [hidden], "relu", out_dim=hidden)
        self.layers = nn.ModuleList(MessagePassing(hidden) for _ in range(int(cfg.get("num_layers", 2))))
        graph = 2 * hidden + 1
        # spawn logit, mean direction, mean distance
        self.node_head, _ = mlp(hidden + graph, [hidden], "relu", out_dim=3)
        self.delete_head, _ = mlp(graph, [hidden], "relu", out_dim=1)
        self.value_head, _ = mlp(graph, [hidden], "relu", out_dim=1)
        self.spawn_log_std = nn.Parameter(torch.full((2,), -1.0))
        self.delete_log_std = nn.Parameter(torch.full((1,), -1.6))
        with torch.no_grad():
            self.delete_head[-1].weight.mul_(0.01)
            self.delete_head[-1].bias.fill_(float(cfg.get("init_delete_mean", -0.8)))
            self.node_head[-1].weight.mul_(0.01)
            self.node_head[-1].bias.zero_()

    def _embed(self, obs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Node embeddings ``[B, M, H]``, graph embedding ``[B, 2H + 1]`` and the float node mask ``[B, M, 1]``."""
        node_mask = obs["node_mask"].to(torch.float32).unsqueeze(-1)
        h = self.encoder(obs["nodes"].float()) * node_mask
        m = node_mask.shape[1]
        adjacency = mean_adjacency(obs["edges"], obs["edge_mask"], m)
        for layer in self.layers:
            h = h + layer(h, adjacency, node_mask)  # residual keeps the node's own features
        count = node_mask.sum(1)
        mean = h.sum(1) / count.clamp(min=1.0)
        peak = h.masked_fill(node_mask == 0, float("-inf")).amax(1)
        peak = torch.where(count > 0, peak, torch.zeros_like(peak))
        return h, torch.cat([mean, peak, count / m], dim=-1), node_mask

    @override(TorchRLModule)
    def _forward(self, batch: dict, **kwargs: Any) -> dict:
        h, graph, node_mask = self._embed(batch[Columns.OBS])
        m = h.shape[1]
        node_out = self.node_head(torch.cat([h, graph[:, None].expand(-1, m, -1)], dim=-1))
        log_std = self.spawn_log_std.expand(*node_out.shape[:2], 2)
        mu_delete = self.delete_head(graph)
        inputs = pack_inputs(node_out[..., 0], node_out[..., 1:], log_std, node_mask[..., 0], mu_delete,
                             self.delete_log_std.expand_as(mu_delete))
        return {Columns.ACTION_DIST_INPUTS: inputs, Columns.EMBEDDINGS: graph}

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict, embeddings: Any = None) -> torch.Tensor:
        if embeddings is None:
            embeddings = self._embed(batch[Columns.OBS])[1]
        return self.value_head(embeddings).squeeze(-1)

    @override(TorchRLModule)
    def get_train_action_dist_cls(self) -> type:
        return HybridGraphDistribution

    @override(TorchRLModule)
    def get_exploration_action_dist_cls(self) -> type:
        return HybridGraphDistribution

    @override(TorchRLModule)
    def get_inference_action_dist_cls(self) -> type:
        return HybridGraphDistribution
