"""HybridGraphDistribution and GraphActorCritic: closed-form entropy and KL against Monte Carlo, padded nodes
contributing nothing, gradients reaching every head, dense message passing against a per-edge loop, and the module
on CUDA where there is one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tree

from rl_speed_envs.durotaxis import DurotaxisVectorEnv
from rl_speed.modules.graph import GraphActorCritic, mean_adjacency
from rl_speed.modules.hybrid_distribution import HybridGraphDistribution, pack_inputs


def random_inputs(generator: torch.Generator, rows: int, nodes: int, mask: torch.Tensor) -> torch.Tensor:
    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale

    return pack_inputs(randn(rows, nodes, scale=1.5), randn(rows, nodes, 2), randn(rows, nodes, 2, scale=0.5),
                       mask, randn(rows, 1), randn(rows, 1, scale=0.5))


@pytest.fixture
def two_distributions():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float64)
    return random_inputs(g, 3, 5, mask), random_inputs(g, 3, 5, mask)


def monte_carlo(dist: HybridGraphDistribution, samples: int, fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error over ``samples`` draws (each row repeated) of ``fn(action)``."""
    torch.manual_seed(1)
    rows = dist.inputs.shape[0]
    big = HybridGraphDistribution(dist.inputs.repeat(samples, 1))
    values = fn(big.sample()).reshape(samples, rows)
    return values.mean(0), values.std(0) / samples ** 0.5


def test_entropy_matches_monte_carlo(two_distributions):
    inputs, _ = two_distributions
    dist = HybridGraphDistribution(inputs)
    big = HybridGraphDistribution(inputs.repeat(200_000, 1))
    mean, error = monte_carlo(dist, 200_000, lambda a: -big.logp(a))
    np.testing.assert_array_less((dist.entropy() - mean).abs(), 5 * error + 1e-9)


def test_kl_matches_monte_carlo(two_distributions):
    p_inputs, q_inputs = two_distributions
    p, q = HybridGraphDistribution(p_inputs), HybridGraphDistribution(q_inputs)
    n = 200_000
    big_p, big_q = HybridGraphDistribution(p_inputs.repeat(n, 1)), HybridGraphDistribution(q_inputs.repeat(n, 1))
    mean, error = monte_carlo(p, n, lambda a: big_p.logp(a) - big_q.logp(a))
    np.testing.assert_array_less((p.kl(q) - mean).abs(), 5 * error + 1e-9)
    assert (p.kl(q) >= 0).all() and torch.allclose(p.kl(p), torch.zeros(3, dtype=torch.float64))


def test_padded_nodes_contribute_nothing(two_distributions):
    inputs, other = two_distributions
    dist = HybridGraphDistribution(inputs)
    action = dist.sample()
    assert (action["spawn"][dist.mask == 0] == 0).all()  # never a spawn request from an empty slot
    # Change everything at padded slots (inputs and actions): log-prob, entropy and KL stay the same.
    changed = inputs.clone().reshape(3, -1)
    nodes = changed[:, :30].reshape(3, 5, 6)
    padded = nodes[..., 5] == 0
    nodes[..., :5][padded] = torch.randn(int(padded.sum()), 5, dtype=torch.float64) * 3
    changed[:, :30] = nodes.reshape(3, 30)
    changed_action = tree.map_structure(torch.clone, action)
    changed_action["spawn"][padded] = 1
    changed_action["spawn_params"][padded] = 9.0
    other_dist = HybridGraphDistribution(other)
    new = HybridGraphDistribution(changed)
    torch.testing.assert_close(new.logp(changed_action), dist.logp(action))
    torch.testing.assert_close(new.entropy(), dist.entropy())
    torch.testing.assert_close(new.kl(other_dist), dist.kl(other_dist))
    # A row with no nodes is just the delete ratio's Gaussian.
    torch.testing.assert_close(dist.entropy()[2], 0.5 + 0.5 * np.log(2 * np.pi) + dist.log_std_delete[2, 0])


def test_spawn_parameters_count_only_where_a_node_spawns(two_distributions):
    inputs, _ = two_distributions
    dist = HybridGraphDistribution(inputs)
    action = dist.sample()
    moved = tree.map_structure(torch.clone, action)
    moved["spawn_params"][action["spawn"] == 0] += 5.0
    torch.testing.assert_close(dist.logp(moved), dist.logp(action))
    moved["spawn_params"][(action["spawn"] == 1) & (dist.mask > 0)] += 1.0
    assert not torch.allclose(dist.logp(moved), dist.logp(action))


def test_deterministic_takes_the_mode(two_distributions):
    inputs, _ = two_distributions
    dist = HybridGraphDistribution(inputs).to_deterministic()
    action = dist.sample()
    torch.testing.assert_close(action["spawn_params"], dist.mu)
    assert ((action["spawn"] == 1) == ((dist.logits > 0) & (dist.mask > 0))).all()


def graph_batch(num_envs: int = 16, steps: int = 6) -> tuple[DurotaxisVectorEnv, dict]:
    env = DurotaxisVectorEnv(num_envs=num_envs)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        action = env.action_space.sample()
        action["delete_ratio"] = rng.uniform(0, 0.2, (num_envs, 1)).astype(np.float32)
        obs = env.step(action)[0]
    return env, obs


def make_module(env: DurotaxisVectorEnv) -> GraphActorCritic:
    torch.manual_seed(0)
    return GraphActorCritic(observation_space=env.single_observation_space, action_space=env.single_action_space,
                            model_config={"hidden": 32})


def test_gradients_reach_every_head():
    env, obs = graph_batch()
    module = make_module(env)
    batch = {"obs": tree.map_structure(torch.from_numpy, obs)}
    out = module._forward(batch)
    dist = HybridGraphDistribution(out["action_dist_inputs"])
    action = dist.sample()
    loss = -dist.logp(action).mean() - dist.entropy().mean() + module.compute_values({}, out["embeddings"]).pow(2).mean()
    loss.backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_dense_message_passing_equals_a_per_edge_loop():
    _, obs = graph_batch()
    edges, mask = torch.from_numpy(obs["edges"]), torch.from_numpy(obs["edge_mask"])
    m = obs["node_mask"].shape[1]
    dense = mean_adjacency(edges, mask, m)
    h = torch.randn(len(edges), m, 8)
    expected = torch.zeros_like(h)
    for b in range(len(edges)):
        neighbours = [[] for _ in range(m)]
        for e in np.flatnonzero(obs["edge_mask"][b]):
            i, j = obs["edges"][b, e]
            neighbours[i].append(j)
            neighbours[j].append(i)
        for i, js in enumerate(neighbours):
            if js:
                expected[b, i] = h[b, js].mean(0)
    torch.testing.assert_close(dense @ h, expected)


def test_module_rejects_other_spaces():
    import gymnasium as gym

    env, _ = graph_batch(2, 0)
    with pytest.raises(ValueError, match="observations must be a Dict"):
        GraphActorCritic(observation_space=gym.spaces.Box(0, 1, (4,)), action_space=env.single_action_space)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_module_on_cuda_matches_cpu():
    env, obs = graph_batch()
    module = make_module(env)
    batch = {"obs": tree.map_structure(torch.from_numpy, obs)}
    cpu = module._forward(batch)
    cuda_module = module.to("cuda")
    out = cuda_module._forward({"obs": tree.map_structure(lambda x: x.cuda(), batch["obs"])})
    torch.testing.assert_close(out["action_dist_inputs"].cpu(), cpu["action_dist_inputs"], atol=1e-4, rtol=1e-4)
    dist = HybridGraphDistribution(out["action_dist_inputs"])
    action = dist.sample()
    assert action["spawn"].is_cuda and torch.isfinite(dist.logp(action)).all()
    assert torch.isfinite(dist.kl(HybridGraphDistribution(out["action_dist_inputs"] * 0.9))).all()
