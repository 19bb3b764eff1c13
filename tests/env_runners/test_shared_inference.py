"""Shared inference (`shared_inference: true`): the remote runners' action step served from the learner's process
through shared memory, with the weights version each runner holds and the noise it drew; refused where it cannot
act as the runner's own forward would."""

from __future__ import annotations

import threading
import time
from multiprocessing import shared_memory
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import rl_speed
from rl_speed import columns as C
from rl_speed.algorithms.fast_ppo import FastPPOConfig
from rl_speed.env_runners import shared_inference as si
from rl_speed.env_runners.batched import BatchedEnvRunner

LANES = 8


def _module():
    rl_speed.register()
    config = FastPPOConfig().environment("CartPole-v1")
    spaces = {"default_policy": (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))}
    return config.get_rl_module_spec(spaces=spaces).build()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs a CUDA GPU (the captured forward)"))]


@pytest.fixture(params=DEVICES)
def server(request):
    module = _module()
    server = si.InferenceServer(module, request.param, si.Layout(LANES, (4,), "float32", 2), slots=4)
    server.publish(0, module.state_dict())
    yield server, module
    server.stop()


def _logits(module, obs):
    with torch.inference_mode():
        return module._forward_inference({"obs": torch.from_numpy(obs)})["action_dist_inputs"].numpy()


def _close(server):
    """Tolerances for the server's logits against the module's alone: a forward of several runners' rows may sum in
    another order (a 16-core Xeon's CPU kernels differed by 1e-7 at 24 rows against 8), and a GPU's kernels differ."""
    return {"rtol": 1e-5, "atol": 1e-6} if server.device.type == "cpu" else {"rtol": 1e-4, "atol": 1e-5}


def test_a_greedy_answer_is_the_modules_best_action(server):
    server, module = server
    client = si.InferenceClient(server.spec(), slot=1)
    obs = np.random.default_rng(0).normal(size=(LANES, 4)).astype(np.float32)
    actions, extra = client(obs, explore=False, version=0)
    np.testing.assert_array_equal(actions, _logits(module, obs).argmax(-1))
    assert extra == {}
    if server.device.type == "cuda":
        assert (LANES, False) in server._graphs  # answered by the replay captured when the server started
    client.close()


def test_an_exploring_answer_is_the_race_of_the_runners_own_noise(server):
    server, module = server
    client = si.InferenceClient(server.spec(), slot=0, seed=5)
    obs = np.random.default_rng(1).normal(size=(LANES, 4)).astype(np.float32)
    actions, extra = client(obs, explore=True, version=0)
    noise = np.random.default_rng(5).standard_exponential((LANES, 2), dtype=np.float32)  # the client's first draw
    np.testing.assert_allclose(extra[C.ACTION_DIST_INPUTS], _logits(module, obs), **_close(server))
    logp_all = torch.log_softmax(torch.from_numpy(extra[C.ACTION_DIST_INPUTS]), -1).numpy()
    np.testing.assert_array_equal(actions, (logp_all - np.log(noise)).argmax(-1))
    np.testing.assert_allclose(extra[C.ACTION_LOGP], logp_all[np.arange(LANES), actions], **_close(server))
    client.close()


def test_each_request_is_answered_with_the_version_it_names(server):
    server, module = server
    newer = {key: value + 1.0 for key, value in module.state_dict().items()}
    server.publish(1, newer)
    client = si.InferenceClient(server.spec(), slot=0)
    obs = np.random.default_rng(2).normal(size=(LANES, 4)).astype(np.float32)
    _, old = client(obs, explore=True, version=0)
    _, new = client(obs, explore=True, version=1)
    _, old_again = client(obs, explore=True, version=0)
    np.testing.assert_allclose(old[C.ACTION_DIST_INPUTS], _logits(module, obs), **_close(server))
    assert not np.allclose(new[C.ACTION_DIST_INPUTS], old[C.ACTION_DIST_INPUTS])
    np.testing.assert_array_equal(old_again[C.ACTION_DIST_INPUTS], old[C.ACTION_DIST_INPUTS])
    client.close()


def test_a_version_the_server_no_longer_holds_is_refused_and_serving_goes_on(server):
    server, module = server
    for version in range(1, si.KEEP_VERSIONS + 1):  # version 0 drops out
        server.publish(version, module.state_dict())
    client = si.InferenceClient(server.spec(), slot=0)
    obs = np.zeros((LANES, 4), np.float32)
    with pytest.raises(RuntimeError, match="at weights version 0: its weights version is not held"):
        client(obs, explore=True, version=0)
    actions, _ = client(obs, explore=True, version=si.KEEP_VERSIONS)
    assert actions.shape == (LANES,)
    client.close()


def test_fewer_lanes_than_a_slot_holds_are_answered_row_for_row(server):
    server, module = server
    client = si.InferenceClient(server.spec(), slot=0)
    obs = np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)  # one lane group of a runner
    actions, extra = client(obs, explore=False, version=0)
    np.testing.assert_array_equal(actions, _logits(module, obs).argmax(-1))
    with pytest.raises(ValueError, match=r"\(9, 4\) observations do not fit the server's slots of 8 x \(4,\)"):
        client(np.zeros((9, 4), np.float32), explore=False, version=0)
    client.close()


def _pending(server, requests):
    """Writes each ``(slot, obs, explore, version)`` request into its slot as a runner would, answers them all in one
    call of the serving thread's step (the requests one look at the pipe finds pending), and reads each answer."""
    clients = {slot: si.InferenceClient(server.spec(), slot=slot, seed=slot) for slot, *_ in requests}
    for slot, obs, explore, version in requests:
        clients[slot]._fill(obs, explore, version)
    server._answer([slot for slot, *_ in requests])
    answers = []
    for slot, obs, explore, version in requests:
        clients[slot]._wait()
        answers.append(clients[slot]._read(len(obs), explore, version))
        clients[slot].close()
    return answers


def test_requests_pending_together_are_answered_by_one_forward_row_for_row(server):
    server, module = server
    server.publish(1, {key: value + 1.0 for key, value in module.state_dict().items()})
    rng = np.random.default_rng(4)
    obs = [rng.normal(size=(LANES, 4)).astype(np.float32) for _ in range(3)]
    answers = _pending(server, [(0, obs[0], True, 0), (1, obs[1], True, 0), (2, obs[2], True, 0)])
    assert (server.forwards, server.requests_served) == (1, 3)
    if server.device.type == "cuda":
        assert (3 * LANES, True) in server._graphs  # the replay captured for three runners served together
    for slot, (actions, extra) in enumerate(answers):
        np.testing.assert_allclose(extra[C.ACTION_DIST_INPUTS], _logits(module, obs[slot]), **_close(server))
        noise = np.random.default_rng(slot).standard_exponential((LANES, 2), dtype=np.float32)  # that runner's own
        logp_all = torch.log_softmax(torch.from_numpy(extra[C.ACTION_DIST_INPUTS]), -1).numpy()
        np.testing.assert_array_equal(actions, (logp_all - np.log(noise)).argmax(-1))


def test_pending_requests_of_other_versions_or_lane_counts_are_each_answered_as_asked(server):
    server, module = server
    newer = {key: value + 1.0 for key, value in module.state_dict().items()}
    server.publish(1, newer)
    rng = np.random.default_rng(6)
    whole, group = rng.normal(size=(LANES, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
    (greedy, _), (old_actions, old), (_, new), (_, part) = _pending(
        server, [(0, whole, False, 0), (1, whole, True, 0), (2, whole, True, 1), (3, group, True, 0)])
    assert (server.forwards, server.requests_served) == (3, 4)  # greedy at 0; exploring at 0 (8 + 3 lanes); at 1
    np.testing.assert_array_equal(greedy, _logits(module, whole).argmax(-1))
    np.testing.assert_allclose(old[C.ACTION_DIST_INPUTS], _logits(module, whole), **_close(server))
    np.testing.assert_allclose(part[C.ACTION_DIST_INPUTS], _logits(module, group), **_close(server))
    newer_module = _module()
    newer_module.load_state_dict(newer)
    np.testing.assert_allclose(new[C.ACTION_DIST_INPUTS], _logits(newer_module, whole), **_close(server))


def test_runners_acting_at_once_each_get_their_own_answer(server):
    """Four runners' threads ask concurrently, so the server finds one to four requests pending at each look."""
    server, module = server
    rng = np.random.default_rng(7)
    obs = [rng.normal(size=(LANES, 4)).astype(np.float32) for _ in range(4)]
    expected = [_logits(module, o) for o in obs]
    failures = []

    def act_repeatedly(slot):
        client = si.InferenceClient(server.spec(), slot=slot)
        for _ in range(50):
            _, extra = client(obs[slot], explore=True, version=0)
            if not np.allclose(extra[C.ACTION_DIST_INPUTS], expected[slot], **_close(server)):
                failures.append(slot)
        client.close()

    threads = [threading.Thread(target=act_repeatedly, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == [] and server.requests_served == 200


def test_stop_removes_the_shared_memory_and_the_pipes_and_a_runner_then_says_so():
    module = _module()
    server = si.InferenceServer(module, "cpu", si.Layout(LANES, (4,), "float32", 2), slots=1)
    server.publish(0, module.state_dict())
    spec = server.spec()
    client = si.InferenceClient(spec, slot=0)
    server.stop()
    assert not Path(spec["directory"]).exists()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=spec["memory"])
    with pytest.raises(RuntimeError, match="the server in the learner's process is gone"):
        client(np.zeros((LANES, 4), np.float32), explore=False, version=0)


def _config(**training):
    rl_speed.register()
    return (FastPPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=LANES, rollout_fragment_length=16)
            .training(train_batch_size_per_learner=256, minibatch_size=128, num_epochs=1, shared_inference=True,
                      **training)
            .debugging(seed=3))


def test_fastppo_trains_with_its_runners_acting_through_the_learners_process(ray_session):
    algo = _config().build_algo()
    try:
        for _ in range(2):
            algo.train()
        server = algo._inference
        assert server.requests_served == 2 * 2 * 16  # every step of both runners in both iterations, none else
        assert list(server._versions) == [0, 1, 2]  # the first weights, then each update's, published before a push
        assert algo.env_runner_group.foreach_env_runner(lambda r: r._captured is None and r._shared is not None,
                                                        local_env_runner=False) == [True, True]
    finally:
        algo.stop()
    assert not Path(server.spec()["directory"]).exists()  # the algorithm's stop removed the server's pipes


def test_a_seeded_run_learns_the_same_weights_again(ray_session):
    weights = []
    for _ in range(2):
        algo = _config().build_algo()
        try:
            algo.train()
            algo.train()
            module = si.local_learner(algo).module["default_policy"]
            weights.append([p.detach().clone() for p in module.parameters()])
        finally:
            algo.stop()
    assert all(torch.equal(a, b) for a, b in zip(*weights))


def test_a_runner_that_was_not_connected_refuses_to_sample():
    runner = BatchedEnvRunner(config=_config(), worker_index=1, num_workers=2)
    with pytest.raises(RuntimeError, match="`shared_inference` is on but this runner was not connected"):
        runner.sample_columns()
    runner.stop()


def test_a_runner_on_another_machine_than_the_server_is_refused(ray_session):
    runner = BatchedEnvRunner(config=_config(), worker_index=1, num_workers=2)
    spec = {"node_id": "another-node", "layout": {"obs_shape": [4]}}
    with pytest.raises(ValueError, match="this runner runs on another one; leave it off on a cluster"):
        runner.connect_shared_inference(spec)
    runner.stop()


@pytest.mark.parametrize("changes, message", [
    ({"num_learners": 1}, r"the server runs in the local learner's process \(`num_learners: 0`\)"),
    ({"num_env_runners": 0}, r"it serves remote env runners \(`num_env_runners` >= 1\)"),
    ({"num_gpus_per_env_runner": 0.1}, r"their GPU share \(`num_gpus_per_env_runner`=0.1\) would sit idle"),
    ({"cuda_graph_env_runners": True, "num_gpus_per_env_runner": 0.05}, "leave `cuda_graph_env_runners` off"),
    ({"shared_inference": "yes"}, r"`shared_inference`='yes' must be true or false"),
])
def test_what_it_cannot_serve_is_refused_at_config_time(changes, message):
    config = _config()
    config.update_from_dict(changes)
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_a_restored_checkpoint_publishes_its_weights_for_the_runners(ray_session, tmp_path):
    algo = _config().build_algo()
    try:
        algo.train()
        algo.train()
        algo.save_to_path(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()
    restored = _config().build_algo()
    try:
        restored.restore_from_path(str(tmp_path / "checkpoint"))
        assert 2 in restored._inference._versions  # the checkpoint's version, which the runners now hold
        restored.train()  # acts with it, then with the next
    finally:
        restored.stop()


def test_a_runner_ray_restarts_is_connected_again(ray_session):
    import ray

    algo = _config().build_algo()
    try:
        algo.train()
        actor = algo.env_runner_group._worker_manager._actors[1]
        ray.kill(actor, no_restart=False)  # RLlib restarts it (restart_failed_env_runners) and restores it
        # until it is back: its new process starts in seconds, longer than a few iterations on a fast machine (on a
        # 16-core GPU box four iterations ended first, 2026-12-05)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                algo._counters["total_num_restored_workers"] >= 1  # the new process went through the restore
                and algo.env_runner_group.num_healthy_remote_env_runners() == 2):
            algo.train()
        algo.train()  # (one more with it back)
        assert algo._counters["total_num_restored_workers"] >= 1
        assert algo.env_runner_group.num_healthy_remote_env_runners() == 2
        assert algo.env_runner_group.foreach_env_runner(lambda r: r._shared is not None,
                                                        local_env_runner=False) == [True, True]
    finally:
        algo.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_runners_are_served_while_the_learner_captures_its_step(ray_session):
    # async sampling: the runners ask while the learner's first updates warm up and capture its step
    algo = _config(cuda_graph=True, async_sampling=True).learners(num_gpus_per_learner=1).build_algo()
    try:
        for _ in range(4):
            algo.train()
        assert algo._inference.device.type == "cuda" and algo._inference.requests_served > 0
        assert si.local_learner(algo)._step_graphs.replays > 0
    finally:
        algo.stop()


def test_a_server_that_fails_to_start_leaves_no_shared_memory_or_pipes_behind(monkeypatch):
    import tempfile

    def folders():
        return set(Path(tempfile.gettempdir()).glob("rl_speed_inference_*"))

    def blocks():
        return set(Path("/dev/shm").glob("psm_*")) if Path("/dev/shm").exists() else set()

    before = (folders(), blocks())

    def no_fifo(path):
        raise OSError("no named pipes here")

    monkeypatch.setattr(si.os, "mkfifo", no_fifo)
    with pytest.raises(OSError, match="no named pipes here"):
        si.InferenceServer(_module(), "cpu", si.Layout(LANES, (4,), "float32", 2), slots=2)
    assert (folders(), blocks()) == before
