"""The learner profile: the summary's arithmetic on known events, a real profile of a remote CPU learner over one
FastPPO iteration, and the learner-scaling table row built from it. (The CUDA figures need a GPU host.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from benchmarks.scaling.learner_profile import profile_one_iteration, start, stop, summarize


def _event(name, device_type, start_us, end_us, is_user_annotation=False):
    return SimpleNamespace(name=name, device_type=device_type, time_range=SimpleNamespace(start=start_us, end=end_us),
                           is_user_annotation=is_user_annotation)


def test_summary_counts_overlapping_device_time_once_and_sorts_host_calls():
    events = [
        _event("aten::mm", DeviceType.CPU, 0, 10),
        _event("cudaLaunchKernel", DeviceType.CPU, 1, 2),
        _event("cudaLaunchKernel", DeviceType.CPU, 3, 4),
        _event("cudaStreamSynchronize", DeviceType.CPU, 20, 50),
        _event("aten::add", DeviceType.CPU, 12, 14),
        _event("sm90_gemm", DeviceType.CUDA, 5, 25),  # compute stream
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", DeviceType.CUDA, 20, 40),  # NCCL stream, overlapping
        _event("elementwise_kernel", DeviceType.CUDA, 60, 70),  # after a gap
        # DDP's annotation of its all-reduce on the device timeline, spanning the kernel and the gap after it: not a
        # kernel, so neither busy time nor NCCL time (counted, it doubled the NCCL figure on a 4-GPU host).
        _event("nccl:all_reduce", DeviceType.CUDA, 20, 60, is_user_annotation=True),
    ]
    summary = summarize(events, window_s=0.5)
    assert summary == {"window_s": 0.5, "device_busy_s": pytest.approx(45e-6), "nccl_s": pytest.approx(20e-6),
                       "kernels": 3, "launches": 2, "host_sync_s": pytest.approx(30e-6), "ops": 2}


def test_a_cpu_learner_profiles_one_iteration(ray_session):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=32)
              .rl_module(model_config={"fcnet_hiddens": [16], "head_fcnet_hiddens": []})
              .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=2)
              .learners(num_learners=1, num_cpus_per_learner=1)
              .debugging(seed=1))
    algo = config.build_algo()
    try:
        algo.train()
        (summary,) = profile_one_iteration(algo)
        assert summary["ops"] > 100  # 8 minibatch steps of forward, loss, backward and Adam
        assert summary["window_s"] > 0
        assert summary["device_busy_s"] == summary["nccl_s"] == summary["kernels"] == summary["launches"] == 0
        (again,) = profile_one_iteration(algo)  # each call starts and stops its own profilers
        assert again["ops"] > 100
    finally:
        algo.stop()


def test_a_learner_is_profiled_once_at_a_time():
    learner = SimpleNamespace()
    start(learner)
    try:
        with pytest.raises(RuntimeError, match="already being profiled"):
            start(learner)
    finally:
        stop(learner)


def test_profile_row_gives_each_figure_min_max_over_the_learners():
    from benchmarks.scaling.learner_scaling import profile_row

    learner = {"window_s": 2.0, "device_busy_s": 0.4, "nccl_s": 0.05, "kernels": 1200, "launches": 1100,
               "host_sync_s": 0.01, "ops": 5000}
    profiles = [{"learn_s": 1.0, "advantages_s": 0.25}]
    result = {"profiles": profiles, "after": [learner, {**learner, "device_busy_s": 0.5, "nccl_s": 0.2}]}
    assert profile_row(2, "own", 11, result) == (
        "| 2 | own | 11 | 1.250 s | 0.400-0.500 s | 0.050-0.200 s | 1,200 | 1,100 | 0.010 s | 5,000 |")
    failed = profile_row(1, "own", 42, {"profiles": profiles, "after": "profile failed: RuntimeError: no CUPTI"})
    assert failed == "| 1 | own | 42 | 1.250 s | profile failed: RuntimeError: no CUPTI | | | | | |"
