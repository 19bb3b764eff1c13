"""TokenActorCritic: shapes, that cutting the empty token slots is exact, the tables' gradients, and a forward and
backward that a CUDA graph can capture."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.core.columns import Columns

from rl_speed.modules.tokens import TokenActorCritic, token_features


def module(slots=50):
    return TokenActorCritic(observation_space=gym.spaces.Box(0, 255, (slots, 3), np.uint8),
                            action_space=gym.spaces.Discrete(5), model_config={"token_dim": 16, "fcnet_hiddens": [32]})


def tokens(batch, slots, present, seed=0):
    rng = np.random.default_rng(seed)
    obs = np.full((batch, slots, 3), 255, np.uint8)
    for b in range(batch):
        k = present[b]
        obs[b, :k, 0] = rng.integers(0, 200, k)
        obs[b, :k, 1:] = rng.integers(0, 60, (k, 2))
    return torch.from_numpy(obs)


def test_outputs_and_exact_cut():
    torch.manual_seed(0)
    net = module()
    obs = tokens(4, 50, [3, 10, 0, 7])
    out = net._forward({Columns.OBS: obs})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (4, 5)
    assert net.compute_values({Columns.OBS: obs}).shape == (4,)
    # more empty slots at the end change nothing: the cut is exact
    padded = torch.cat([obs, torch.full((4, 30, 3), 255, dtype=torch.uint8)], dim=1)
    wide = module(80)
    wide.load_state_dict(net.state_dict())
    assert torch.allclose(wide._forward({Columns.OBS: padded})[Columns.ACTION_DIST_INPUTS],
                          out[Columns.ACTION_DIST_INPUTS], atol=1e-6)


def test_rejects_other_spaces():
    with pytest.raises(ValueError, match="uint8 tokens"):
        TokenActorCritic(observation_space=gym.spaces.Box(0, 1, (4,), np.float32),
                         action_space=gym.spaces.Discrete(2))


def test_table_gradients_equal_embedding_bags_own():
    # The tables' gradients come from one index_add_ per table; they must equal embedding_bag's own backward.
    from rl_speed.modules.tokens import _TokenBagSum

    torch.manual_seed(0)
    weight = torch.randn(300, 8, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 300, (6 * 5,))
    index[:10] = 7  # heavy repetition, as in real batches
    scale = torch.rand(6 * 5, dtype=torch.float64)
    upstream = torch.randn(6, 8, dtype=torch.float64)
    ours = _TokenBagSum.apply(weight, index, scale, 5)
    (grad_ours,) = torch.autograd.grad((ours * upstream).sum(), weight)
    reference = torch.nn.functional.embedding_bag(index, weight, torch.arange(0, 30, 5), mode="sum",
                                                  per_sample_weights=scale)
    (grad_reference,) = torch.autograd.grad((reference * upstream).sum(), weight)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(grad_ours, grad_reference)


def recurrent_module(slots=50):
    from rl_speed.modules.tokens import RecurrentTokenActorCritic

    return RecurrentTokenActorCritic(observation_space=gym.spaces.Box(0, 255, (slots, 3), np.uint8),
                                     action_space=gym.spaces.Discrete(5),
                                     model_config={"token_dim": 16, "fcnet_hiddens": [32], "lstm_cell_size": 8})


def test_recurrent_token_chunks_equal_single_steps():
    """A training chunk [B, L, N, 3] gives what stepping the same tokens one at a time gives, with the state reset
    where ``is_first`` marks an episode start (the runner's rule)."""
    from rl_speed.columns import IS_FIRST

    torch.manual_seed(0)
    net = recurrent_module()
    b, length = 3, 4
    obs = torch.stack([tokens(b, 50, [5, 0, 12], seed=t) for t in range(length)], dim=1)  # [B, L, N, 3]
    is_first = torch.zeros(b, length, dtype=torch.bool)
    is_first[1, 2] = True
    state = {"h": torch.randn(b, 8), "c": torch.randn(b, 8)}
    with torch.no_grad():
        chunk = net._forward({Columns.OBS: obs, Columns.STATE_IN: state, IS_FIRST: is_first})
        h, c, logits = state["h"], state["c"], []
        for t in range(length):
            keep = (~is_first[:, t:t + 1]).float()
            out = net._forward({Columns.OBS: obs[:, t], Columns.STATE_IN: {"h": h * keep, "c": c * keep}})
            h, c = out[Columns.STATE_OUT]["h"], out[Columns.STATE_OUT]["c"]
            logits.append(out[Columns.ACTION_DIST_INPUTS])
    assert chunk[Columns.ACTION_DIST_INPUTS].shape == (b, length, 5)
    torch.testing.assert_close(chunk[Columns.ACTION_DIST_INPUTS], torch.stack(logits, dim=1))
    torch.testing.assert_close(chunk[Columns.STATE_OUT]["h"], h)


def test_recurrent_token_module_rejects_other_spaces():
    from rl_speed.modules.tokens import RecurrentTokenActorCritic

    with pytest.raises(ValueError, match="RecurrentTokenActorCritic: observations must be uint8 tokens"):
        RecurrentTokenActorCritic(observation_space=gym.spaces.Box(0, 1, (4,), np.float32),
                                  action_space=gym.spaces.Discrete(2))


def test_token_features_equal_the_sum_over_present_tokens():
    """The sparse encoder against its definition, token by token (rows with no token give zeros)."""
    torch.manual_seed(0)
    net = module()
    obs = tokens(5, 50, [3, 10, 0, 7, 50], seed=1)
    expected = torch.zeros(5, 16)
    for b in range(5):
        rows = [row for row in obs[b].tolist() if row[0] != 255]
        for location, feature, value in rows:
            index = feature * 256 + location
            expected[b] += net.presence.weight[index] + value / 255.0 * net.magnitude.weight[index]
        expected[b] /= max(len(rows), 1)
    with torch.no_grad():
        assert torch.allclose(token_features(net.presence, net.magnitude, obs), expected, atol=1e-5)


def test_under_capture_every_slot_is_kept_and_nothing_waits_for_the_device(monkeypatch, syncing_ops):
    """What a captured step runs (`cuda_graph: true`): no cut, so no read-back of the last present slot, and the same
    features and gradients as the cut."""
    torch.manual_seed(0)
    net = module()
    obs = tokens(4, 50, [3, 10, 0, 7])
    cut = token_features(net.presence, net.magnitude, obs)
    cut_grads = torch.autograd.grad(cut.square().sum(), [net.presence.weight, net.magnitude.weight])
    monkeypatch.setattr("rl_speed.modules.tokens._capturing", lambda obs: True)
    monkeypatch.setattr("rl_speed.modules.tokens._last_present_slot",
                        lambda obs: pytest.fail("the last present slot was read back under capture"))
    with syncing_ops() as ops:
        whole = token_features(net.presence, net.magnitude, obs)
        grads = torch.autograd.grad(whole.square().sum(), [net.presence.weight, net.magnitude.weight])
    assert ops.seen == []
    torch.testing.assert_close(whole, cut)
    for ours, expected in zip(grads, cut_grads):
        torch.testing.assert_close(ours, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_forward_and_backward_are_captured_and_replayed_on_a_gpu():
    torch.manual_seed(0)
    net = module().cuda()
    static = tokens(64, 50, [i % 50 for i in range(64)]).cuda()
    params = [p for p in net.parameters()]

    def step():  # the policy's logits: the value head's parameters are unused, so their gradients are None
        loss = net._forward({Columns.OBS: static})[Columns.ACTION_DIST_INPUTS].square().mean()
        return torch.autograd.grad(loss, params, allow_unused=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up, eager (the cut runs here)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    new = tokens(64, 50, [(7 * i) % 50 for i in range(64)], seed=3).cuda()
    static.copy_(new)
    graph.replay()
    expected = step()  # the eager step on the same tokens, with the cut
    used = {name for (name, _), grad in zip(net.named_parameters(), expected) if grad is not None}
    assert {"presence.weight", "magnitude.weight"} <= used, used
    for ours, theirs in zip(captured, expected):
        assert (ours is None) == (theirs is None)
        if theirs is not None:
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
