"""A bad experiment file ends with one clear paragraph and exit status 2, before Ray starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rl_speed.cli.main import main, rllib_main

BAD = Path(__file__).parent / "bad_files"
GOOD = Path(__file__).parents[2] / "tuned_examples" / "snake_ppo.yaml"

# file -> fragments the message must contain (the key that is wrong, and what to do)
CASES = {
    "missing_run.yaml": ["snake.run", "has no `run` key", "add `run: PPO`"],
    "unknown_algorithm.yaml": ["snake.run", "unknown algorithm 'PPOO'", "did you mean 'PPO'", "use one of"],
    "unknown_env.yaml": ["snake.env", "unknown environment 'rl_speed/Snak-v0'", "did you mean 'rl_speed/Snake-v0'"],
    "syntax_error.yaml": ["YAML syntax error at line", "check indentation"],
    "unknown_config_key.yaml": ["snake.config.learning_rate", "not a config key of PPO"],
    "unknown_experiment_key.yaml": ["snake.stopp", "did you mean 'stop'", "use only run, env"],
    "bad_env_config.yaml": ["snake.config.env_config", "`height`=2", "integer from 4 to 64"],
    "unknown_env_config_key.yaml": ["snake.config.env_config", "'hieght'", "accepted: height, width"],
    "bad_stop_value.yaml": ["snake.stop.training_iteration", "not a number"],
    "rllib_rejects_config.yaml": ["snake.config", "minibatch_size", "train_batch_size_per_learner"],
    "not_a_mapping.yaml": ["mapping of experiment names"],
    "bad_checkpoint_key.yaml": ["snake.checkpoint_config.checkpoint_every", "checkpoint_frequency"],
    "string_for_number.yaml": ["snake.config.num_epochs", "must be a number, got 'many'", "write a number"],
    "unread_model_config_key.yaml": ["durotaxis.config", "['fcnet_hiddens'] are not read by GraphActorCritic",
                                     "it reads hidden, num_layers"],
}


@pytest.fixture
def no_ray_start(monkeypatch):
    """Fails the test if the command tries to start or join Ray."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("ray.init() was called for a bad file")

    monkeypatch.setattr(ray, "init", refuse)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_file_gets_one_paragraph_naming_file_key_and_fix(name, capsys, no_ray_start):
    status = main(["train", str(BAD / name)])
    err = capsys.readouterr().err.strip()
    assert status == 2  # rejected before any Ray process started (no_ray_start)
    assert err.startswith(f"Error in {BAD / name}") and "Fix:" in err
    assert "\n\n" not in err and "Traceback" not in err
    for fragment in CASES[name]:
        assert fragment in err, (fragment, err)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--stop", "{training_iteration: 1}"], ["the --stop flag", "not valid JSON"]),
        (["--config", "[1, 2]"], ["the --config flag", "not a JSON object"]),
        (["--config", '{"lrr": 0.1}'], ["snake-ppo.config.lrr", "did you mean 'lr'"]),
    ],
)
def test_bad_flags_are_reported_like_bad_files(flags, fragments, capsys, no_ray_start):
    assert main(["train", str(GOOD), *flags]) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_missing_file(capsys, no_ray_start):
    assert main(["train", "no/such/file.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_console_scripts_exit_with_status_2():
    bin_dir = Path(sys.executable).parent
    for cmd in ([bin_dir / "rl-speed", "train"], [bin_dir / "rllib", "train", "file"]):
        proc = subprocess.run([*map(str, cmd), str(BAD / "unknown_env.yaml")], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert "unknown environment" in proc.stderr and proc.stdout == ""


def test_rllib_command_only_knows_train_file(capsys):
    assert rllib_main(["rollout", "x"]) == 2
    assert "rllib train file FILE.yaml" in capsys.readouterr().err


def test_experiment_flag_picks_experiments_and_refuses_an_unknown_name(tmp_path, capsys, monkeypatch):
    import rl_speed.cli.train as train_module
    from rl_speed.experiments import load_experiments

    two = tmp_path / "two.yaml"
    experiment = "  run: FastPPO\n  env: CartPole-v1\n  stop: {training_iteration: 1}\n"
    two.write_text(f"first:\n{experiment}second:\n{experiment}broken:\n  run: PPO\n  env: Nope-v9\n")
    assert [e.name for e in load_experiments(two, only=["second", "first"])] == ["first", "second"]  # file order

    import ray

    ran = []
    monkeypatch.setattr(train_module, "init_ray", lambda *args: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # (train() ends the Ray it started; this one started none)
    monkeypatch.setattr(train_module, "run_experiments", lambda experiments, *a, **k: ran.extend(experiments) or 0)
    assert main(["train", str(two), "--experiment", "second"]) == 0
    assert [e.name for e in ran] == ["second"]  # the broken experiment was neither run nor checked

    monkeypatch.setattr(ray, "init", lambda *a, **k: (_ for _ in ()).throw(AssertionError("Ray started")))
    assert main(["train", str(two), "--experiment", "pong"]) == 2
    err = capsys.readouterr().err
    assert "there is no experiment 'pong'; the file holds ['broken', 'first', 'second']" in err
    assert "--experiment NAME" in err


def test_cuda_mps_without_nvidias_control_program_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch,
                                                                                no_ray_start):
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder without nvidia-cuda-mps-control
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    assert main(["train", str(GOOD), "--cuda-mps"]) == 2
    err = capsys.readouterr().err
    assert "`nvidia-cuda-mps-control` is not on PATH" in err and "drop --cuda-mps" in err


def test_cuda_mps_on_a_cluster_is_refused_with_how_to_start_it_there(capsys, no_ray_start):
    assert main(["train", str(GOOD), "--cuda-mps", "--address", "10.0.0.1:6379"]) == 2
    err = capsys.readouterr().err
    assert "do not inherit it" in err and "before `ray start`" in err
