"""`rl-speed bench atari-learner`: the Pong GPU preset's FastPPO learner timed alone on one real batch, rows of
learner settings side by side."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from benchmarks.throughput import atari_learner

pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")

# The CPU tests shrink the local runner to 4 emulators (ale-py builds and seeds one in about 0.2 s on 2 cores, the
# preset's 16 in 3.5 s) and warm up once: they check what the bench does, not its figures.
LANES = 4


def test_every_row_updates_on_the_same_batch_with_its_own_minibatch(ray_session):
    rows = {"preset": {}, "half minibatch": None}
    out = atari_learner.measure("cpu", repeats=1, rows=rows, batch=64, epochs=1, lanes=LANES, warmup=1)
    assert list(out) == ["preset", "half minibatch"]
    preset, half = out["preset"], out["half minibatch"]
    assert preset["batch"] == half["batch"] == 64  # 4 lanes x 16 steps, sampled once for both rows
    assert half["minibatch"] == preset["minibatch"] // 2
    assert half["steps"] == 2 * preset["steps"]  # the same epochs over twice as many minibatches
    assert preset["seconds"] > 0 and half["seconds"] > 0


def test_an_update_moves_the_learners_weights(ray_session):
    algo = atari_learner.build("cpu", {}, batch=32, epochs=1, lanes=LANES)
    try:
        assert algo.config.num_envs_per_env_runner == LANES
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
        before = [p.detach().clone() for p in module.parameters()]
        atari_learner.update(algo, atari_learner.sample_batch(algo))
        assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))
    finally:
        algo.stop()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal is for CPU-only ones")
def test_the_gpu_presets_learner_alone_is_a_valid_config_without_remote_runners():
    # (the GPU preset's captured runner step needs remote runners: the bench's learner, with none, refused it)
    config = atari_learner.learner_config("cuda", {})
    config.validate()
    assert config.num_env_runners == 0 and not config.cuda_graph_env_runners and config.num_gpus_per_learner > 0


def test_device_cuda_without_a_gpu_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="atari-learner --device cuda: this machine has no CUDA GPU"):
        atari_learner.run(repeats=1, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_preset_row_replays_its_captured_step(ray_session):
    algo = atari_learner.build("cuda", {}, batch=512, epochs=1)
    try:
        atari_learner.update(algo, atari_learner.sample_batch(algo))
        atari_learner.update(algo, atari_learner.sample_batch(algo))
        assert algo.learner_group._learner._step_graphs.replays > 0
    finally:
        algo.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_row_builds_with_a_minibatch_above_one_runners_fragment(ray_session):
    # The preset's batch comes from 15 runners; the bench's one local runner must sample all of it, or FastPPO
    # refuses a minibatch larger than one runner's fragment (the first GPU run of the bench stopped there).
    algo = atari_learner.build("cuda", {"minibatch_size": 1024})
    try:
        cfg = algo.config
        assert cfg.rollout_fragment_length * cfg.num_envs_per_env_runner == cfg.train_batch_size_per_learner
    finally:
        algo.stop()


def test_dqn_rows_learn_from_the_same_replay_with_their_own_batch(ray_session):
    rows = {"preset": {}, "batch x2": None}
    out = atari_learner.measure_dqn("cpu", repeats=1, rows=rows, batch=16, iteration_steps=8, fill=32, lanes=LANES,
                                    warmup=1)
    preset, double = out["preset"], out["batch x2"]
    assert preset["filled"] == double["filled"] >= 32  # one runner's batches, added to both rows' replays
    assert (preset["batch"], double["batch"]) == (16, 32)
    assert preset["updates"] == 2 * double["updates"]  # the same env steps per iteration at the preset's ratio
    assert all(m["replay"] > 0 and m["learn"] > 0 for m in out.values())


def test_the_dqn_row_without_normalize_obs_differs_from_the_preset_in_that_key_only(ray_session):
    preset = atari_learner.build_dqn("cpu", {}, batch=16, iteration_steps=32, lanes=LANES)
    plain = atari_learner.build_dqn("cpu", atari_learner.WITHOUT_NORMALIZE_OBS, batch=16, iteration_steps=32,
                                    lanes=LANES)
    try:
        assert preset.config.model_config["normalize_obs"] is True
        assert plain.config.model_config == {k: v for k, v in preset.config.model_config.items()
                                             if k != "normalize_obs"}
        modules = [a.learner_group._learner.module[DEFAULT_MODULE_ID] for a in (preset, plain)]
        assert [m.keeps_input_statistics for m in modules] == [True, False]
    finally:
        preset.stop()
        plain.stop()


def test_a_dqn_learning_phase_samples_its_updates_and_moves_the_q_net(ray_session):
    algo = atari_learner.build_dqn("cpu", {}, batch=16, iteration_steps=8, lanes=LANES)
    try:
        assert algo.config.num_envs_per_env_runner == LANES
        atari_learner.fill_replay(algo, [algo.env_runner.sample_columns()])
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
        before = [p.detach().clone() for p in module.parameters()]
        sampled = algo.replay_buffer.get_metrics()["sampled"]
        updates = atari_learner.updates_per_iteration(algo.config)
        seconds = atari_learner.learn_phase(algo, updates)
        assert algo.replay_buffer.get_metrics()["sampled"] - sampled == updates * 16
        assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))
        assert seconds["replay"] > 0 and seconds["learn"] > 0
    finally:
        algo.stop()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal is for CPU-only ones")
def test_dqn_device_cuda_without_a_gpu_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="atari-dqn-learner --device cuda: this machine has no CUDA GPU"):
        atari_learner.run_dqn(repeats=1, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_dqn_preset_replays_its_captured_step_from_gpu_replay(ray_session):
    small_replay = {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 20_000, "storage_device": "cuda"}
    algo = atari_learner.build_dqn("cuda", {"replay_buffer_config": small_replay}, iteration_steps=1024)
    try:
        assert algo.replay_buffer.device == "cuda"
        atari_learner.fill_replay(algo, [algo.env_runner.sample_columns() for _ in range(2)])
        for _ in range(2):
            atari_learner.learn_phase(algo, atari_learner.updates_per_iteration(algo.config))
        assert algo.learner_group._learner._step_graphs.replays > 0
    finally:
        algo.stop()


def test_a_rows_backend_flags_hold_for_its_updates_only(monkeypatch):
    def state():
        return (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                torch.backends.cuda.matmul.allow_tf32)

    seen = []
    monkeypatch.setattr(atari_learner, "_update", lambda algo, batches: seen.append(state()))
    before = state()
    changes, flags = atari_learner.split_flags(atari_learner.CUDA_ROWS["seeded (cuDNN deterministic)"])
    assert changes == {} and flags == {"cudnn.deterministic": True, "cudnn.benchmark": False}
    atari_learner.update(None, [], flags)
    atari_learner.update(None, [], atari_learner.split_flags(atari_learner.CUDA_ROWS["TF32 matmuls"])[1])
    atari_learner.update(None, [])
    assert seen == [(True, False, before[2]), (before[0], before[1], True), before]
    assert state() == before


def test_a_row_that_cannot_run_says_why_and_the_others_still_run(ray_session):
    rows = {"preset": {}, "broken": {"torch.backends.nosuch.flag": True}, "half minibatch": None}
    out = atari_learner.measure("cpu", repeats=1, rows=rows, batch=64, epochs=1, lanes=LANES, warmup=1)
    assert list(out) == ["preset", "broken", "half minibatch"]
    assert out["broken"] == {"failed": "AttributeError: module 'torch.backends' has no attribute 'nosuch'"}
    assert out["preset"]["seconds"] > 0 and out["half minibatch"]["seconds"] > 0
