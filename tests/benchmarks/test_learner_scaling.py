"""The learner-scaling bench's configs (the GPU run itself needs a multi-GPU host): strong scaling keeps the batch of
the runners and splits it over the learners, and ``cpus_per_learner`` reaches RLlib's learner config."""

from __future__ import annotations

import os

import pytest

from benchmarks.scaling import core_pinning
from benchmarks.scaling.learner_scaling import PRESETS, _load, _scaled, efficiency, learner_counts, run


def test_efficiency_is_against_the_first_rows_rate_per_learner():
    assert efficiency(300.0, 4, 1, 100.0) == pytest.approx(0.75)
    # A table whose first row has 4 learners (its own base, 100%), and 8 learners at 1.5x its rate: 75%.
    assert efficiency(400.0, 4, 4, 400.0) == pytest.approx(1.0)
    assert efficiency(600.0, 8, 4, 400.0) == pytest.approx(0.75)


def test_learner_counts_double_up_to_the_gpus():
    assert learner_counts(0) == [1] and learner_counts(4) == [1, 2, 4] and learner_counts(8) == [1, 2, 4, 8]


@pytest.mark.parametrize("learners", [1, 2, 4])
def test_scaled_config_splits_one_batch_over_the_learners(learners):
    preset = _load(PRESETS["grid arena"])
    config = _scaled(preset, runners=8, learners=learners, device="cuda", cpus_per_learner=3)
    batch = 8 * preset.num_envs_per_env_runner * preset.rollout_fragment_length
    assert config.num_env_runners == 8 and config.num_learners == learners
    assert config.train_batch_size_per_learner * learners == batch
    assert config.num_gpus_per_learner == 1 and config.num_cpus_per_learner == 3
    assert config.minibatch_size == min(preset.minibatch_size, batch // learners)


def test_cpus_per_learner_below_one_is_refused_before_ray_starts():
    with pytest.raises(ValueError, match="`cpus_per_learner` must be >= 1, got 0"):
        run(device="cpu", presets=("grid arena",), cpus_per_learner=0)


def test_pinning_more_learners_than_cores_allow_is_refused_before_ray_starts(monkeypatch):
    monkeypatch.setattr(core_pinning, "physical_cores", lambda: [[0], [1]])
    with pytest.raises(ValueError, match=r"`pin_cores` needs a physical core per learner \(2\) and one more"):
        run(device="cpu", presets=("grid arena",), learners=(1, 2), pin_cores=True)


def test_learner_counts_below_one_are_refused_before_ray_starts():
    with pytest.raises(ValueError, match=r"`learners` \[2, 0\] must be counts from 1"):
        run(device="cpu", presets=("grid arena",), learners=(2, 0))


def test_per_learner_spread_reads_the_profiles_medians():
    from benchmarks.scaling.learner_scaling import per_learner_spread

    profiles = [{"learner_advantages_s_min": a, "learner_advantages_s_max": 2 * a, "learner_join_s_min": a / 2,
                 "learner_join_s_max": a, "learner_updates_s_min": u, "learner_updates_s_max": u + 0.1}
                for a, u in ((0.01, 0.2), (0.02, 0.3), (0.03, 0.4))]
    assert per_learner_spread({"profiles": profiles + [{}]}) == "0.020-0.040 s (join 0.010-0.020 s) / 0.300-0.400 s"


def test_unknown_gpus_seen_and_override_keys_are_refused_before_ray_starts():
    with pytest.raises(ValueError, match=r"`gpus_seen` \['mine'\] must name some of \['own', 'all'\]"):
        run(device="cpu", presets=("grid arena",), gpus_seen=("mine",))
    with pytest.raises(ValueError, match=r"unknown config keys \['torch_compile_lerner'\]"):
        run(device="cpu", presets=("grid arena",), overrides={"torch_compile_lerner": False})
    with pytest.raises(ValueError, match=r"may not set \['num_envs_per_env_runner'\]: each row's runners"):
        run(device="cpu", presets=("grid arena",), overrides={"num_envs_per_env_runner": 96, "lr": 1e-4})


def test_learners_seeing_sets_ray_trains_switch_only_while_building(monkeypatch):
    from benchmarks.scaling.learner_scaling import SHARE_GPUS_ENV, learners_seeing

    monkeypatch.delenv(SHARE_GPUS_ENV, raising=False)
    with learners_seeing("all"):
        assert os.environ[SHARE_GPUS_ENV] == "1"
    assert SHARE_GPUS_ENV not in os.environ
    monkeypatch.setenv(SHARE_GPUS_ENV, "1")  # a user's own setting comes back afterwards
    with learners_seeing("own"):
        assert os.environ[SHARE_GPUS_ENV] == "0"
    assert os.environ[SHARE_GPUS_ENV] == "1"


def test_repeats_below_one_are_refused_before_ray_starts():
    with pytest.raises(ValueError, match="`repeats` must be >= 1, got 0"):
        run(0, device="cpu", presets=("grid arena",))
