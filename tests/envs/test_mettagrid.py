"""The real MettaGrid as a buffer-bound vector env: a missing [mettagrid] extra and bad settings fail with clear
messages (always run); with mettagrid installed, lanes, NEXT_STEP autoreset per simulation, seeded resets, reachable
reward, and the PettingZoo form stock RLlib uses."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rl_speed_envs.mettagrid import check_config


def test_missing_extra_names_the_install_command(monkeypatch, tmp_path):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.experiments import ExperimentFileError, load_experiments
    from rl_speed_envs.mettagrid import MettaGridVectorEnv

    monkeypatch.setitem(sys.modules, "mettagrid.simulator", None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'rl_speed\[mettagrid\]'"):
        MettaGridVectorEnv(num_envs=24)
    with pytest.raises(ImportError, match=r"\[mettagrid\] extra"):
        FastPPOConfig().environment("rl_speed/MettaGrid-v0").validate()
    path = tmp_path / "mg.yaml"
    path.write_text("mg:\n  run: PPO\n  env: rl_speed/MettaGrid-v0\n")  # stock PPO: the CLI checks too
    with pytest.raises(ExperimentFileError, match=r"mg\.env.*pip install"):
        load_experiments(path)


@pytest.mark.parametrize("settings, message", [
    ({"agents": 8}, "unknown env_config keys"),
    ({"view": 12}, "must be odd"),
    ({"num_agents": 0}, "`num_agents`=0 is invalid"),
    ({"width": 5, "height": 5, "num_agents": 8, "altars": 4}, "do not fit"),
    ({"heart_reward": "1"}, "must be a number"),
])
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        check_config(settings)


def test_bad_key_in_a_yaml_file_exits_2_naming_it(tmp_path):
    import subprocess

    path = tmp_path / "mg.yaml"
    path.write_text("mg:\n  run: FastPPO\n  env: rl_speed/MettaGrid-v0\n  config:\n    env_config: {agents: 8}\n")
    proc = subprocess.run([sys.executable, "-m", "rl_speed.cli.main", "train", str(path)], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert "env_config" in proc.stderr and "agents" in proc.stderr


@pytest.fixture
def mettagrid():
    return pytest.importorskip("mettagrid", reason="the [mettagrid] extra is not installed")


def test_lanes_autoreset_and_seeds(mettagrid):
    from rl_speed_envs.mettagrid import MettaGridVectorEnv

    env = MettaGridVectorEnv(num_envs=16, num_agents=8, width=11, height=11, altars=4, walls=2, max_steps=5)
    obs, _ = env.reset(seed=7)
    assert obs.shape == (16, 200, 3) and obs.dtype == np.uint8
    assert env.single_action_space.n == 5 and env.num_sims == 2
    twin = MettaGridVectorEnv(num_envs=16, num_agents=8, width=11, height=11, altars=4, walls=2, max_steps=5)
    assert (twin.reset(seed=7)[0] == obs).all()  # seeded maps repeat
    for t in range(5):
        obs, rewards, terminated, truncated, _ = env.step(np.zeros(16, np.int64))
    assert truncated.all() and not terminated.any()  # the time limit truncates, every agent of every simulation
    obs, rewards, terminated, truncated, _ = env.step(np.zeros(16, np.int64))  # the reset step
    assert not truncated.any() and (rewards == 0).all()
    with pytest.raises(ValueError, match="multiple of num_agents"):
        MettaGridVectorEnv(num_envs=10, num_agents=8)


def test_random_play_earns_reward(mettagrid):
    from rl_speed_envs.mettagrid import MettaGridVectorEnv

    env = MettaGridVectorEnv(num_envs=48, num_agents=24)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    total = sum(env.step(rng.integers(0, 5, 48))[1].sum() for _ in range(100))
    assert total > 0  # altars are reachable: moving into one gives a heart


def test_pettingzoo_form_matches_the_vector_form_spaces(mettagrid):
    from rl_speed.multi_agent import MettaGridMultiAgentEnv
    from rl_speed_envs.mettagrid import MettaGridVectorEnv

    form = MettaGridMultiAgentEnv({"num_agents": 4, "width": 9, "height": 9})
    obs, _ = form.reset(seed=0)
    vector = MettaGridVectorEnv(num_envs=4, num_agents=4, width=9, height=9)
    assert set(obs) == {0, 1, 2, 3}
    assert form.get_observation_space(0) == vector.single_observation_space
    assert form.get_action_space(0) == vector.single_action_space


def test_core_step_matches_mettagrids_own_step(mettagrid):
    """The env steps each simulation through the C++ core (skipping the Python wrapper's timers); the same seed and
    actions through mettagrid's own ``Simulation.step`` give the same observations, rewards and episode ends."""
    from rl_speed_envs.mettagrid import MettaGridVectorEnv

    fast = MettaGridVectorEnv(num_envs=16, num_agents=8, width=11, height=11, altars=4, max_steps=40)
    own = MettaGridVectorEnv(num_envs=16, num_agents=8, width=11, height=11, altars=4, max_steps=40)
    fast.reset(seed=3), own.reset(seed=3)
    assert all(step == sim._c_sim.step for step, sim in zip(fast._steps, fast._sims))
    rng = np.random.default_rng(0)
    for t in range(90):  # past two episode ends, so restarted simulations step through the core too
        own._steps = [sim.step for sim in own._sims]
        actions = rng.integers(0, 5, 16)
        for a, b in zip(fast.step(actions), own.step(actions)):
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)
