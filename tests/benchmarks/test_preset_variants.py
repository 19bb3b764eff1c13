"""The preset-variants bench: variants of one YAML experiment, interleaved, one table row per run; bad variants are
refused before anything starts."""

from __future__ import annotations

import pytest

from benchmarks.race.preset_variants import main, run, variant_config
from rl_speed.experiments import ExperimentFileError

EXPERIMENT = """\
cartpole-fastppo:
  run: FastPPO
  env: CartPole-v1
  config:
    num_env_runners: 2
    num_envs_per_env_runner: 8
    rollout_fragment_length: 64
    train_batch_size_per_learner: 1024
    minibatch_size: 256
    num_epochs: 1
    async_sampling: true
"""


@pytest.fixture
def experiment(tmp_path):
    path = tmp_path / "cartpole.yaml"
    path.write_text(EXPERIMENT)
    return path


def test_variants_run_interleaved_one_row_each(ray_session, experiment):
    table = run(experiment, {"A": {}, "B": {"max_requests_in_flight_per_env_runner": 2}}, ["A", "B", "A"],
                seconds=1.0, warmup=1)
    rows = [line for line in table.splitlines() if line.startswith("| A |") or line.startswith("| B |")]
    assert [row.split("|")[1].strip() for row in rows] == ["A", "B", "A"]
    in_flight = [float(row.split("|")[7]) for row in rows]
    # Two remote runners holding one request each, then more: each run's config took effect.
    assert in_flight[0] == in_flight[2] == 2 and in_flight[1] > 2, in_flight
    assert all(float(row.split("|")[2].replace(",", "")) > 0 for row in rows)
    # the runners' own step split, RLlib's env_step_timer / rlmodule_inference_timer, in ms
    env_ms, inference_ms = zip(*(map(float, row.split("|")[6].replace("ms", "").split("/")) for row in rows))
    assert all(0 < ms < 1e3 for ms in env_ms + inference_ms), (env_ms, inference_ms)
    # cores busy per process group: the two remote runners and the driver (with its local learner) worked
    for row in rows:
        groups, total = row.split("|")[9].split("(")
        runners, driver, learners, _ray, _other = map(float, groups.split("/"))
        assert runners > 0 and driver > 0 and learners == 0 and float(total.strip(" )")) > 0, row
    assert '- B: `{"max_requests_in_flight_per_env_runner": 2}`' in table


def test_an_unknown_config_key_is_refused_before_ray_starts(experiment):
    with pytest.raises(ExperimentFileError, match="not_a_key"):
        run(experiment, {"A": {"not_a_key": 1}}, ["A"])


def test_a_file_of_several_experiments_needs_one_named_and_an_existing_name(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(EXPERIMENT + EXPERIMENT.replace("cartpole-fastppo:", "cartpole-big:").replace("1024", "2048"))
    with pytest.raises(ValueError, match=r"holds the experiments \['cartpole-big', 'cartpole-fastppo'\]; name one "
                                         "with --experiment NAME"):
        run(path, {"A": {}}, ["A"])
    with pytest.raises(ExperimentFileError, match=r"no experiment 'pong'; the file holds \['cartpole-big', "
                                                  r"'cartpole-fastppo'\]"):
        run(path, {"A": {}}, ["A"], experiment="pong")
    assert variant_config(path, {}, "cartpole-big").train_batch_size_per_learner == 2048
    assert variant_config(path, {"lr": 0.01}, "cartpole-fastppo").lr == 0.01


def test_an_order_naming_no_variant_is_refused(experiment):
    with pytest.raises(ValueError, match=r"\['C'\] in the order are not among the variants \['A', 'B'\]"):
        run(experiment, {"A": {}, "B": {}}, ["A", "C"])


def test_a_variant_that_is_not_a_json_object_exits_2(experiment, capsys):
    with pytest.raises(SystemExit) as stop:
        main([str(experiment), "--variant", "A", "[1]", "--order", "A"])
    assert stop.value.code == 2 and "must be a JSON object" in capsys.readouterr().err


def test_the_driver_profile_shares_out_each_runs_extra_iterations(ray_session, experiment):
    table = run(experiment, {"A": {}}, ["A"], seconds=1.0, warmup=1, profile_iterations=2)
    profile = table[table.index("Driver profile, run 1 (A), 2 iterations"):]
    assert "by cumulative time:" in profile and "by own time:" in profile
    callees = profile[profile.index("callees (seconds over all 2 iterations):"):]
    # the weight push and the learner's join + values + GAE, each with what it called
    for name in ("sync_weights_if_due", "prepare_columns"):
        assert any(f"({name})" in line and "->" in line for line in callees.splitlines()), (name, callees)
    # the algorithm's training step is in it, at no more than the whole of an iteration
    line = next(line for line in profile.splitlines() if "(training_step)" in line)
    per_iteration = float(line.split()[3])
    assert 0 < per_iteration < 60, line


def test_a_forward_free_variant_samples_without_its_modules_forward(ray_session, experiment):
    table = run(experiment, {"A": {}, "F": {}}, ["F"], seconds=1.0, warmup=1, forward_free_variants=("F",))
    row = next(line for line in table.splitlines() if line.startswith("| F |"))
    assert float(row.split("|")[2].replace(",", "")) > 0  # it trained at some rate
    assert '- F: `{}` (forward-free runners)' in table


def test_a_forward_free_name_that_is_no_variant_is_refused(experiment):
    with pytest.raises(ValueError, match=r"\['G'\] in --forward-free are not among the variants \['A'\]"):
        run(experiment, {"A": {}}, ["A"], forward_free_variants=("G",))
