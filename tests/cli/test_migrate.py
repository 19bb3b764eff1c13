"""Ray-2.9-era experiment files: every renamed key is translated with a notice (one test per row of the table),
keys without a new-stack meaning are refused by name, `--strict` refuses old keys, `rl-speed migrate` prints a file
that loads strictly, and RLlib's old tuned examples (tests/cli/old_yaml, `run:` changed to the Fast algorithm) run
to their stop criteria through `rllib train file`."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl_speed.experiments import ExperimentFileError, load_experiments
from rl_speed.cli.main import USAGE_ERROR, main
from rl_speed.migrate import CONFIG_RENAMES, STOP_RENAMES, MigrationError, migrate_experiment

OLD = Path(__file__).parent / "old_yaml"
VALUES = {"observation_filter": "MeanStdFilter", "num_gpus": 1, "framework": "torch", "model": {"fcnet_hiddens": [8]},
          "enable_connectors": True, "_enable_new_api_stack": False}


@pytest.mark.parametrize("old", list(CONFIG_RENAMES))
def test_each_renamed_config_key_is_translated_with_a_notice(old):
    value = VALUES.get(old, 3)
    spec, notices = migrate_experiment({"run": "PPO", "env": "CartPole-v1", "config": {old: value}})
    rename = CONFIG_RENAMES[old]
    assert old not in spec["config"]
    if rename.new is None:
        assert spec["config"] == {}
        assert notices == [f"`{old}` removed: {rename.why}."]
    else:
        expected = rename.value(value) if rename.value else value
        assert spec["config"] == {rename.new: expected}
        assert len(notices) == 1 and f"`{old}` -> `{rename.new}`" in notices[0]
    with pytest.raises(MigrationError, match=f"`{old}` is a Ray-2.9-era key"):
        migrate_experiment({"config": {old: value}}, strict=True)


@pytest.mark.parametrize("old", list(STOP_RENAMES))
def test_each_renamed_stop_key_is_translated_with_a_notice(old):
    spec, notices = migrate_experiment({"stop": {old: 10}})
    assert spec["stop"] == {STOP_RENAMES[old]: 10}
    assert notices == [f"stop `{old}` -> `{STOP_RENAMES[old]}` (the new stack's result key)."]
    with pytest.raises(MigrationError, match=f"stop key `{old}`"):
        migrate_experiment({"stop": {old: 10}}, strict=True)


@pytest.mark.parametrize("config, needle", [
    ({"framework": "tf"}, "`framework: tf`: rl_speed and RLlib's new stack train with torch only"),
    ({"model": {"lstm_use_prev_action": True}}, "`model.lstm_use_prev_action` has no new-stack form"),
    ({"observation_filter": "ConcurrentMeanStdFilter"}, "has no new-stack form"),
    ({"num_workers": 1, "num_env_runners": 2}, "both `num_workers` and its new form `num_env_runners`"),
    ({"num_gpus": 2}, "set `num_learners: 2` and `num_gpus_per_learner: 1`"),
])
def test_keys_without_a_new_stack_meaning_are_refused_by_name(config, needle):
    with pytest.raises(MigrationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        migrate_experiment({"config": config})


@pytest.mark.parametrize("path", sorted(OLD.glob("*.yaml")), ids=lambda p: p.stem)
def test_old_tuned_examples_load_translated(path):
    (experiment,) = load_experiments(path)
    config = experiment.config
    assert experiment.notices and all("->" in n or "removed" in n for n in experiment.notices)
    assert "env_runners/episode_return_mean" in experiment.stop
    assert "env_runners/num_env_steps_sampled_lifetime" in experiment.stop
    if path.stem == "pendulum-ppo":
        assert (config.num_envs_per_env_runner, config.num_epochs, config.minibatch_size) == (20, 6, 64)
        assert config.train_batch_size_per_learner == 512 and config.lambda_ == 0.1
        assert config.model_config["fcnet_hiddens"] == [256, 256]
    if "ppo" in path.stem:
        assert config._env_to_module_connector is not None  # observation_filter: MeanStdFilter
        (piece,) = config._env_to_module_connector(None, None, None)
        assert type(piece).__name__ == "MeanStdFilter"
    with pytest.raises(ExperimentFileError, match="Ray-2.9-era key"):
        load_experiments(path, strict=True)


def test_migrate_prints_a_file_that_loads_strictly(tmp_path, capsys):
    assert main(["migrate", str(OLD / "cartpole-ppo.yaml")]) == 0
    out, err = capsys.readouterr()
    assert "`num_sgd_iter` -> `num_epochs`" in err and "`framework` removed" in err
    migrated = tmp_path / "migrated.yaml"
    migrated.write_text(out)
    (experiment,) = load_experiments(migrated, strict=True)
    assert experiment.config.num_env_runners == 1 and experiment.config.num_epochs == 6
    assert yaml.safe_load(out)["cartpole-ppo"]["config"]["env_to_module_connector"] == ["MeanStdFilter"]


def test_train_strict_refuses_old_keys_before_ray_starts(capsys):
    assert main(["train", str(OLD / "cartpole-dqn.yaml"), "--strict"]) == USAGE_ERROR
    assert "Ray-2.9-era key" in capsys.readouterr().err


def test_connectors_named_in_yaml_must_exist(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("x:\n  run: FastPPO\n  env: CartPole-v1\n  config:\n    env_to_module_connector: [MeanStdFiltr]\n")
    with pytest.raises(ExperimentFileError, match="did you mean 'MeanStdFilter'"):
        load_experiments(path)


def _run_old(name: str, tmp_path: Path, env: dict) -> tuple[float, float]:
    path = OLD / f"{name}.yaml"
    proc = subprocess.run([str(Path(sys.executable).parent / "rllib"), "train", "file", str(path),
                           "--storage-path", str(tmp_path), "--num-cpus", "2"],
                          capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "`num_workers`" in proc.stderr or "`num_envs_per_worker`" in proc.stderr or "`model`" in proc.stderr \
        or "stop `episode_reward_mean`" in proc.stderr
    (trial,) = [p for p in (tmp_path / name).iterdir() if p.is_dir()]
    rows = list(csv.DictReader(open(trial / "progress.csv")))
    best = max(float(r["env_runners/episode_return_mean"]) for r in rows
               if r["env_runners/episode_return_mean"] not in ("", "nan"))
    return best, float(rows[-1]["env_runners/num_env_steps_sampled_lifetime"])


@pytest.mark.slow
@pytest.mark.ci
def test_old_cartpole_ppo_file_reaches_its_stop_reward(tmp_path, cli_env):
    best, steps = _run_old("cartpole-ppo", tmp_path, cli_env)
    print(json.dumps({"file": "cartpole-ppo", "best": best, "steps": steps}))
    assert best >= 150, (best, steps)


@pytest.mark.slow
@pytest.mark.parametrize("name, reward", [("pendulum-ppo", -500), ("cartpole-dqn", 150)])
def test_old_files_reach_their_stop_rewards(name, reward, tmp_path, cli_env):
    best, steps = _run_old(name, tmp_path, cli_env)
    print(json.dumps({"file": name, "best": best, "steps": steps}))
    assert best >= reward, (best, steps)


def test_connectors_named_in_yaml_are_built_with_their_arguments(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("x:\n  run: FastPPO\n  env: CartPole-v1\n  config:\n    env_to_module_connector:\n"
                    "      - PrevActionsPrevRewards: {n_prev_actions: 2}\n      - FlattenObservations\n")
    (experiment,) = load_experiments(path)
    first, second = experiment.config._env_to_module_connector(None, None, None)
    assert (type(first).__name__, first.n_prev_actions, type(second).__name__) == \
        ("PrevActionsPrevRewards", 2, "FlattenObservations")
