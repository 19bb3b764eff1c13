"""The Atari race (Pong, Breakout): its contenders' configs, its table from the judge's files, the CPU split for
side-by-side runs."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from benchmarks.race import race_atari
from benchmarks.race.judge import JudgeFiles


def _write_run(directory, contender, games, ran=True, why=None, game=None, seed=0, clock="process start"):
    """A finished contender run as run_contender leaves it: the judge's CSV and meta.json (without ``game``: as runs
    recorded before the game was, which are Pong's)."""
    out = directory / f"{race_atari.slug(contender)}-seed{seed}"
    out.mkdir()
    if games:
        (out / "77.csv").write_text("".join(f"{t},{steps},{ret}\n" for t, steps, ret in games))
    meta = {"contender": contender, "seed": seed, "max_seconds": 600.0, "ran": ran, "machine": "test box", "cpus": 16,
            "device": "cuda"} | ({"clock": clock} if clock else {})
    (out / "meta.json").write_text(json.dumps(meta | ({"why": why} if why else {}) | ({"game": game} if game else {})))


def test_section_reads_each_contenders_files(tmp_path):
    winning = [(100.0 + i, 1000 * (i + 1), -21.0 + 2 * i) for i in range(25)]  # last 20: mean of -11..27 = 8
    _write_run(tmp_path, "FastPPO (ours)", [(t, s, r + 11.0) for t, s, r in winning])  # mean 19 from game 25
    _write_run(tmp_path, "PPO (ours)", winning)
    _write_run(tmp_path, "SB3 PPO (zoo)", [], ran=False)
    _write_run(tmp_path, "SB3 DQN (zoo)", [], ran=False, why="its replay buffer does not fit")
    table = race_atari.section(str(tmp_path))
    rows: dict[str, str] = {}
    for line in table.splitlines():  # the race table's row per contender (the per-run rows come after it)
        if line.startswith("| "):
            rows.setdefault(line.split(" | ")[0].strip("| "), line)
    assert "124.0 (124.0-124.0) s" in rows["FastPPO (ours)"] and "25,000" in rows["FastPPO (ours)"]
    assert "not reached" in rows["PPO (ours)"] and "8.00" in rows["PPO (ours)"]
    assert "not run (extra not installed)" in rows["SB3 PPO (zoo)"]
    assert "FastDQN (ours)" not in rows  # no run of it in the directory
    # a run that says why it did not run: that reason, not a guess about extras
    assert "SB3 DQN (zoo)" not in rows and "- SB3 DQN (zoo), seed 0: not run: its replay buffer does not fit" in table
    assert "time cap 600 s" in table
    assert "Started but not finished" not in table


def test_section_names_the_runs_whose_clock_started_after_the_imports(tmp_path):
    games = [(100.0, 1000, -21.0)]
    _write_run(tmp_path, "FastPPO (ours)", games)
    assert "Clock:" not in race_atari.section(str(tmp_path))
    _write_run(tmp_path, "FastPPO (ours)", games, seed=1, clock=None)  # a run recorded before the clock's fix
    assert "Clock: 1 of 2 runs counted from after their driver's imports" in race_atari.section(str(tmp_path))


def test_section_names_runs_that_started_and_did_not_finish(tmp_path):
    _write_run(tmp_path, "FastPPO (ours)", [(100.0, 1000, -21.0)])
    stopped = tmp_path / "ppo-ours-seed2"  # its judge logs, but no meta.json: stopped, or refused after starting
    stopped.mkdir()
    (stopped / "12.csv").write_text("50.0,1000,-21.0\n")
    (tmp_path / "empty-folder").mkdir()
    table = race_atari.section(str(tmp_path))
    assert "Started but not finished (no `meta.json`), not counted: ppo-ours-seed2;" in table
    assert "| PPO (ours) |" not in table  # not in the table


def test_a_breakout_directory_gets_breakouts_target_and_a_mixed_one_is_refused(tmp_path):
    games = [(10.0 * i, 5000 * i, 320.0) for i in range(1, 21)]  # 20 games of 320: the target (300) at game 20
    _write_run(tmp_path, "FastPPO (ours)", games, game="breakout")
    table = race_atari.section(str(tmp_path))
    assert table.startswith("Breakout (`rl_speed/Atari-v0`, `game: breakout`)") and "target 300" in table
    assert "| FastPPO (ours) | 200.0 (200.0-200.0) s | 100,000" in table
    _write_run(tmp_path, "PPO (ours)", games)  # no game recorded: a Pong run
    with pytest.raises(ValueError, match=r"holds runs of several games \['breakout', 'pong'\]"):
        race_atari.section(str(tmp_path))


def test_a_race_into_another_games_directory_or_of_an_unknown_game_is_refused_before_it_starts(tmp_path):
    _write_run(tmp_path, "PPO (ours)", [(1.0, 100, -21.0)])  # a Pong run
    with pytest.raises(ValueError, match="holds pong runs; race breakout in another directory"):
        race_atari.run(directory=str(tmp_path), game="breakout")
    with pytest.raises(ValueError, match="unknown game 'tennis'"):
        race_atari.run(directory=str(tmp_path / "new"), game="tennis")
    assert not (tmp_path / "new").exists()


def test_cpu_groups_split_this_process_cpus_evenly():
    cpus = sorted(os.sched_getaffinity(0))
    groups = race_atari.cpu_groups(len(cpus))
    assert sorted(c for g in groups for c in g) == cpus and all(len(g) == 1 for g in groups)
    assert sorted(race_atari.cpu_groups(1)[0]) == cpus


def test_rllib_contenders_are_the_presets_with_the_judged_env(tmp_path):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    from benchmarks.throughput.atari import preset

    files = JudgeFiles(str(tmp_path), time.monotonic())
    fast = race_atari.rllib_contender_config("FastPPO (ours)", files, seed=3, device="cuda")
    _, expected = preset("PPO", "cuda")
    assert fast.env == "rl_speed_race/rl_speed/Atari-v0" and fast.env_config == {"game": "pong"} and fast.seed == 3
    assert fast.gym_env_vectorize_mode == "vector_entry_point"
    for key in ("num_env_runners", "num_envs_per_env_runner", "minibatch_size", "num_epochs", "lr", "clip_param"):
        assert getattr(fast, key) == getattr(expected, key), key
    stock = race_atari.rllib_contender_config("PPO (ours)", files, seed=3, device="cuda")
    assert type(stock) is PPOConfig and stock.env == fast.env and stock.seed == 3
    assert (stock.minibatch_size, stock.num_epochs, stock.lr) == (fast.minibatch_size, fast.num_epochs, fast.lr)
    dqn = race_atari.rllib_contender_config("FastDQN (ours)", files, seed=3, device="cuda")
    assert type(dqn).__name__ == "FastDQNConfig" and dqn.env == fast.env
    stock_dqn = race_atari.rllib_contender_config("DQN (ours)", files, seed=3, device="cuda")
    assert type(stock_dqn) is DQNConfig and stock_dqn.env == fast.env and stock_dqn.seed == 3
    for key in ("training_intensity", "n_step", "target_network_update_freq", "lr", "num_env_runners",
                "num_envs_per_env_runner", "train_batch_size_per_learner"):
        assert getattr(stock_dqn, key) == getattr(dqn, key), key
    # Breakout: the presets' Breakout experiments and their env_config, the same judged env, an episode per life for
    # every contender. They train on clipped rewards: FastPPO's runner clips (clip_rewards), stock RLlib's new stack
    # ignores that key, so its env clips.
    for contender, env_clips in (("FastPPO (ours)", False), ("PPO (ours)", True), ("DQN (ours)", True)):
        breakout = race_atari.rllib_contender_config(contender, files, seed=3, device="cuda", game="breakout")
        assert breakout.env == fast.env and breakout.seed == 3
        assert breakout.env_config == {"game": "breakout", "reward_clipping": env_clips, "life_episodes": True}, \
            contender
        assert env_clips or breakout.clip_rewards is True


def test_overrides_reach_both_rllib_contenders_and_bad_ones_stop_before_ray_starts(tmp_path):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    files = JudgeFiles(str(tmp_path), time.monotonic())
    overrides = {"num_epochs": 3, "env_config": {"repeat_action_probability": 0.25}}
    for contender in ("FastPPO (ours)", "PPO (ours)"):
        config = race_atari.rllib_contender_config(contender, files, seed=1, device="cuda", overrides=overrides)
        assert config.num_epochs == 3, contender
        assert config.env_config == {"game": "pong", "repeat_action_probability": 0.25}, contender
    with pytest.raises(ValueError, match="minibatch_size"):
        race_atari.rllib_contender_config("FastPPO (ours)", files, seed=1, device="cuda",
                                          overrides={"minibatch_size": 10**7})
    normalized = {"model_config": {"normalize_obs": True}}  # RLlib's update_from_dict cannot set model_config
    config = race_atari.rllib_contender_config("FastPPO (ours)", files, seed=1, device="cuda", overrides=normalized)
    assert config.model_config["normalize_obs"] is True
    # stock PPO's learner would never update the statistics: it runs without them, as without the captured step
    stock = race_atari.rllib_contender_config("PPO (ours)", files, seed=1, device="cuda", overrides=normalized)
    assert type(stock).__name__ == "PPOConfig" and "normalize_obs" not in stock.model_config
    # Pong's DQN preset standardizes its frames; stock DQN beside it gets the preset's other module keys
    fast_dqn = race_atari.rllib_contender_config("FastDQN (ours)", files, seed=1, device="cuda")
    assert fast_dqn.model_config["normalize_obs"] is True
    stock_dqn = race_atari.rllib_contender_config("DQN (ours)", files, seed=1, device="cuda")
    assert type(stock_dqn).__name__ == "DQNConfig" and "normalize_obs" not in stock_dqn.model_config
    assert stock_dqn.model_config["encoder"] == "nature" and stock_dqn.model_config["batch_norm"] is False


def test_sb3_contenders_take_env_config_overrides_only(tmp_path):
    race_atari.check_overrides("SB3 PPO (zoo)", {"env_config": {"repeat_action_probability": 0.25}})
    with pytest.raises(ValueError, match=r"only `env_config` overrides apply to it, not \['lr'\]"):
        race_atari.run_contender("SB3 PPO (zoo)", 0, 1.0, str(tmp_path), overrides={"lr": 1e-3})
    with pytest.raises(ValueError, match="must be a mapping"):
        race_atari.check_overrides("FastPPO (ours)", {"env_config": 0.25})
    assert not list(tmp_path.iterdir())  # refused before the run's folder was made


def test_final_policy_is_played_under_both_protocols_and_reported_per_contender(tmp_path):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    from types import SimpleNamespace

    import gymnasium as gym
    import numpy as np

    from rl_speed.modules.pixels import NatureActorCritic

    module = NatureActorCritic(observation_space=gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
                               action_space=gym.spaces.Discrete(6), model_config={})
    # 400 frames = 100 agent steps per game, so two games per policy take a moment
    evaluation = race_atari.evaluate_final_policy(SimpleNamespace(get_module=lambda: module),
                                                  {"game": "pong", "max_num_frames_per_episode": 400}, games=2)
    assert set(evaluation) == {"0.0", "0.25"}
    assert all(set(by_policy) == {"greedy", "sampled", "random"} and all(len(r) == 2 for r in by_policy.values())
               for by_policy in evaluation.values())
    for seed, greedy in ((0, 1.0), (1, 3.0)):
        folder = tmp_path / f"fastppo-ours-seed{seed}"
        folder.mkdir()
        (folder / "evaluation.json").write_text(json.dumps({"0.0": {"greedy": [greedy, greedy + 2], "sampled": [seed]},
                                                            "0.25": {"greedy": [-greedy, -greedy], "sampled": [5]}}))
        (folder / "meta.json").write_text(json.dumps({"contender": "FastPPO (ours)", "seed": seed}))
    lines = race_atari.evaluation_lines(race_atari.directory_runs(str(tmp_path)))
    assert lines == ["- FastPPO (ours), final greedy policy (full games; median over 2 seeds): sticky actions 0.0: "
                     "3.00; sticky actions 0.25: -2.00",
                     "- FastPPO (ours), final sampled policy (full games; median over 2 seeds): sticky actions 0.0: "
                     "0.50; sticky actions 0.25: 5.00"]
    with pytest.raises(ValueError, match="--evaluate plays an RLlib module"):
        race_atari.run_contender("SB3 PPO (zoo)", 0, 1.0, str(tmp_path / "sb3"), evaluate_games=2)


def test_saved_modules_are_evaluated_later_with_their_runs_game_and_overrides(tmp_path):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    import gymnasium as gym
    import numpy as np

    from benchmarks.common import checkpoint_module_dir
    from rl_speed.modules.pixels import NatureActorCritic

    module = NatureActorCritic(observation_space=gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
                               action_space=gym.spaces.Discrete(6), model_config={})
    # 400 frames = 100 agent steps per game; sticky 0.25 as trained: one protocol
    overrides = {"env_config": {"max_num_frames_per_episode": 400, "repeat_action_probability": 0.25}}
    for seed, saved in ((0, True), (1, False)):
        _write_run(tmp_path, "FastPPO (ours)", [(1.0, 100, -21.0)], seed=seed)
        folder = tmp_path / f"fastppo-ours-seed{seed}"
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps(meta | {"game": "pong", "overrides": overrides}))
        if saved:
            module.save_to_path(str(checkpoint_module_dir(folder / "checkpoint")))
    assert race_atari.evaluate_saved_runs(str(tmp_path), games=2) == [tmp_path / "fastppo-ours-seed0"]
    evaluation = json.loads((tmp_path / "fastppo-ours-seed0" / "evaluation.json").read_text())
    assert set(evaluation) == {"0.25"} and all(len(r) == 2 for r in evaluation["0.25"].values())
    meta = json.loads((tmp_path / "fastppo-ours-seed0" / "meta.json").read_text())
    assert meta["evaluation_s"] > 0 and meta["evaluated_on"] and meta["seed"] == 0  # the run's own keys kept
    assert not (tmp_path / "fastppo-ours-seed1" / "evaluation.json").exists()  # nothing saved: nothing to play
    assert race_atari.evaluate_saved_runs(str(tmp_path), games=2) == []  # an evaluated run is not played again


def test_a_runs_result_is_kept_before_its_evaluation_and_a_rerun_clears_the_last_ones(tmp_path):
    from types import SimpleNamespace

    def no_module():
        raise RuntimeError("the evaluation broke off")

    meta = {"contender": "FastPPO (ours)", "seed": 0}
    with pytest.raises(RuntimeError, match="broke off"):
        race_atari.finish_rllib_run(SimpleNamespace(get_module=no_module), {"num_env_steps_sampled_lifetime": 7680},
                                    tmp_path, meta, start=0.0, evaluate_games=2, game_config={"game": "pong"})
    kept = json.loads((tmp_path / "meta.json").read_text())
    assert kept["ran"] and kept["env_steps_sampled"] == 7680 and not (tmp_path / "evaluation.json").exists()



def test_the_evaluations_time_is_recorded_beside_the_runs_own(tmp_path, monkeypatch):
    from types import SimpleNamespace

    def slow_evaluation(algo, game_config, games, device):
        time.sleep(0.2)
        return {"0.0": {"greedy": [21.0] * games}}

    monkeypatch.setattr(race_atari, "evaluate_final_policy", slow_evaluation)
    race_atari.finish_rllib_run(SimpleNamespace(), {"num_env_steps_sampled_lifetime": 7680}, tmp_path,
                                {"seed": 0}, start=time.monotonic(), evaluate_games=2, game_config={"game": "pong"})
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["evaluation_s"] >= 0.2 and meta["seconds"] < 0.2  # the run's time is the clock's, not the evaluation's
    assert json.loads((tmp_path / "evaluation.json").read_text()) == {"0.0": {"greedy": [21.0, 21.0]}}


def test_a_rerun_replaces_the_last_runs_log_meta_and_evaluation(tmp_path):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    folder = tmp_path / "sb3-ppo-zoo-seed0"
    folder.mkdir()
    (folder / "evaluation.json").write_text('{"0.0": {"greedy": [21.0]}}')
    (folder / "123.csv").write_text("1.0,100,21.0\n")
    # SB3 installed: one second of its PPO; not installed: a run that says why it did not run. Either way a new run.
    race_atari.run_contender("SB3 PPO (zoo)", 0, 1.0, str(tmp_path), device="cpu")
    assert not (folder / "evaluation.json").exists() and not (folder / "123.csv").exists()
    assert json.loads((folder / "meta.json").read_text())["seconds"] > 0
    assert json.loads((folder / "meta.json").read_text())["clock"] == "call"  # not the contender command's process


def test_the_contender_command_counts_from_its_process_start(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(race_atari, "run_contender", lambda *args, **kwargs: calls.append(kwargs["start"]))
    race_atari.main(["contender", "FastPPO (ours)", "--dir", str(tmp_path)])
    assert calls == [pytest.approx(race_atari.process_start(), abs=0.05)]


def test_sb3_dqn_contender_runs_through_the_judge_and_says_when_its_buffer_does_not_fit(tmp_path, monkeypatch):
    """The SB3 DQN contender on this CPU: with a buffer this machine holds, it runs until its time is up (learning
    starts at rl-zoo's 100k steps, far beyond 8 s) and the judge's log is on disk; with one no machine holds, it
    records why it did not run, and the table says so."""
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    pytest.importorskip("stable_baselines3", reason="needs the [bench] extra: python -m pip install 'rl_speed[bench]'")
    monkeypatch.setitem(race_atari.ATARI_DQN_ZOO, "buffer_size", 20_000)  # rl-zoo's 1M needs 2 x 26 GiB
    race_atari.run_contender("SB3 DQN (zoo)", seed=1, max_seconds=8.0, directory=str(tmp_path), device="cpu")
    out = tmp_path / "sb3-dqn-zoo-seed1"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["ran"] and meta["contender"] == "SB3 DQN (zoo)" and 8.0 <= meta["seconds"] < 60
    assert list(out.glob("*.csv"))

    monkeypatch.setitem(race_atari.ATARI_DQN_ZOO, "buffer_size", 10**12)
    race_atari.run_contender("SB3 DQN (zoo)", seed=2, max_seconds=8.0, directory=str(tmp_path), device="cpu")
    meta = json.loads((tmp_path / "sb3-dqn-zoo-seed2" / "meta.json").read_text())
    assert not meta["ran"] and "1,000,000,000,000 transitions does not fit this machine's memory" in meta["why"]
    assert "- SB3 DQN (zoo), seed 2: not run: its replay buffer" in race_atari.section(str(tmp_path))


def test_bench_without_the_atari_extra_names_its_install_command(capsys, monkeypatch):
    import sys

    from rl_speed.cli.main import main

    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if the extra were not installed: `import ale_py` fails
    assert main(["bench", "race-atari", "--repeats", "1"]) == 2
    assert "rl_speed[atari]" in capsys.readouterr().err


def test_a_contender_with_fewer_games_than_the_window_says_so(tmp_path):
    _write_run(tmp_path, "PPO (ours)", [(1.0, 100, -21.0)] * 3)
    row = next(line for line in race_atari.section(str(tmp_path)).splitlines() if line.startswith("| PPO (ours)"))
    assert "-inf" not in row and "(1 of 1 with fewer than 20 episodes)" in row


def test_the_pool_runs_every_command_once_and_never_two_on_one_slot(tmp_path):
    """Real processes on two slots: each logs its slot and start / end times; no slot runs two at once, at most two
    run at a time, and each command ran once, in its slot's CPUs."""
    log = tmp_path / "log"
    script = ("import os, sys, time; t = time.time(); time.sleep(0.3); "
              "open(sys.argv[1], 'a').write(f\"{sys.argv[2]} {os.environ['SLOT']} {t} {time.time()} "
              "{sorted(os.sched_getaffinity(0))}\\n\")")
    cpus = sorted(os.sched_getaffinity(0))
    slots = [({"SLOT": "0"}, cpus[:1]), ({"SLOT": "1"}, cpus[-1:])]
    race_atari.run_pool([[sys.executable, "-c", script, str(log), str(i)] for i in range(5)], slots,
                        poll_seconds=0.05)
    runs = [line.split(" ", 4) for line in log.read_text().splitlines()]
    assert sorted(int(r[0]) for r in runs) == [0, 1, 2, 3, 4]
    for slot, (_, slot_cpus) in enumerate(slots):
        mine = sorted((float(r[2]), float(r[3])) for r in runs if r[1] == str(slot))
        assert all(end <= next_start for (_, end), (next_start, _) in zip(mine, mine[1:]))  # one at a time
        assert all(r[4] == str(slot_cpus) for r in runs if r[1] == str(slot))
    assert {r[1] for r in runs} == {"0", "1"}  # both slots were used


def test_an_unknown_contender_is_refused_before_anything_runs(tmp_path):
    pytest.importorskip("ale_py", reason="the race checks the [atari] extra first")
    with pytest.raises(ValueError, match="unknown contenders \\['PPO \\(theirs\\)'\\]"):
        race_atari.run(contenders=("PPO (theirs)",), directory=str(tmp_path))


def test_missing_only_queues_just_the_runs_the_directory_does_not_hold_finished(tmp_path):
    _write_run(tmp_path, "FastPPO (ours)", [(1.0, 100, -21.0)])  # seed 0, finished under a 600 s cap
    _write_run(tmp_path, "SB3 PPO (zoo)", [], ran=False)  # seed 0, its extra was missing: made again
    runs = race_atari.directory_runs(str(tmp_path))
    contenders = ("FastPPO (ours)", "SB3 PPO (zoo)")
    assert race_atari.pending_jobs(runs, contenders, range(0, 2), 600.0, missing_only=True) == [
        (0, "SB3 PPO (zoo)"), (1, "FastPPO (ours)"), (1, "SB3 PPO (zoo)")]
    everything = [(0, "FastPPO (ours)"), (0, "SB3 PPO (zoo)"), (1, "FastPPO (ours)"), (1, "SB3 PPO (zoo)")]
    assert race_atari.pending_jobs(runs, contenders, range(0, 2), 600.0, missing_only=False) == everything
    # a run under another time cap, or with other --config overrides, is not this race's: made again
    assert race_atari.pending_jobs(runs, contenders, range(0, 2), 300.0, missing_only=True) == everything
    assert race_atari.pending_jobs(runs, contenders, range(0, 2), 600.0, missing_only=True,
                                   overrides={"lr": 0.001}) == everything


def test_missing_only_under_full_time_remakes_rllib_runs_that_stopped_at_the_target_but_not_sb3s(tmp_path):
    _write_run(tmp_path, "FastPPO (ours)", [(1.0, 100, -21.0)])  # stopped at the target (no full_time)
    _write_run(tmp_path, "SB3 PPO (zoo)", [(1.0, 100, -21.0)])  # SB3 always stops there; --full-time skips it
    runs = race_atari.directory_runs(str(tmp_path))
    contenders = ("FastPPO (ours)", "SB3 PPO (zoo)")
    assert race_atari.pending_jobs(runs, contenders, range(0, 1), 600.0, True, full_time=True) == [
        (0, "FastPPO (ours)")]
    assert race_atari.pending_jobs(runs, contenders, range(0, 1), 600.0, True) == []


def test_missing_only_counts_a_run_done_only_under_the_races_own_config(tmp_path):
    config = {"lr": [[0, 0.00025], [8000000, 0.0]]}
    _write_run(tmp_path, "FastPPO (ours)", [(1.0, 100, -21.0)])
    folder = tmp_path / "fastppo-ours-seed0"
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta | {"overrides": config}))
    runs = race_atari.directory_runs(str(tmp_path))
    assert race_atari.pending_jobs(runs, ("FastPPO (ours)",), range(0, 2), 600.0, True, config) == [
        (1, "FastPPO (ours)")]
    assert race_atari.pending_jobs(runs, ("FastPPO (ours)",), range(0, 2), 600.0, True) == [
        (0, "FastPPO (ours)"), (1, "FastPPO (ours)")]  # the preset's race does not count the annealed run


def test_a_contender_that_missed_on_some_seeds_also_gets_its_median_over_all_seeds(tmp_path):
    """Hits at 100, 200 and 300 s and two misses: the hits' median is 200 s, all five seeds' is 300 s (a miss ranks
    after every hit); with three misses of five the median over all seeds was not reached."""
    def games_until(t_end, hit):
        return [(t_end - 20 + i, 1000 * i, 19.0 if hit else -21.0) for i in range(20)]  # 20 games: one window

    for seed, (t, hit) in enumerate([(100, True), (200, True), (300, True), (600, False), (600, False)]):
        _write_run(tmp_path, "FastDQN (ours)", games_until(t, hit), seed=seed)
    row = next(line for line in race_atari.section(str(tmp_path)).splitlines() if line.startswith("| FastDQN"))
    assert "| 199.0 (99.0-299.0) s; all 5 seeds: median 299.0 s |" in row and "| 3/5 |" in row
    _write_run(tmp_path, "FastDQN (ours)", games_until(600, False), seed=5)
    _write_run(tmp_path, "FastDQN (ours)", games_until(600, False), seed=6)
    row = next(line for line in race_atari.section(str(tmp_path)).splitlines() if line.startswith("| FastDQN"))
    assert "all 7 seeds: median not reached" in row and "| 3/7 |" in row


class _FakeAlgo:
    """Each train() call: one finished game of ``score`` in the judge's files."""

    def __init__(self, files, score):
        self.files, self.score, self.calls = files, score, 0

    def train(self):
        self.calls += 1
        self.files.record(self.calls * 100, [self.score])
        return {"iteration": self.calls}


def test_training_stops_at_the_target_and_records_when_its_first_iteration_ended(tmp_path):
    files = JudgeFiles(str(tmp_path), time.monotonic())
    startup = {"built_s": 0.5}
    algo = _FakeAlgo(files, 21.0)
    result = race_atari.train_until(algo, files, race_atari.GAMES["pong"], 60.0, startup)
    assert algo.calls == race_atari.GAMES["pong"].window  # 20 games of 21: the target's mean from the 20th on
    assert result == {"iteration": algo.calls}
    assert 0 < startup["first_iteration_s"] < 60 and startup["built_s"] == 0.5


def test_training_that_never_reaches_the_target_stops_at_the_cap(tmp_path):
    files = JudgeFiles(str(tmp_path), time.monotonic())
    startup = {}
    algo = _FakeAlgo(files, -21.0)
    race_atari.train_until(algo, files, race_atari.GAMES["pong"], 0.2, startup)
    assert algo.calls > race_atari.GAMES["pong"].window and time.monotonic() - files.start >= 0.2
    assert "first_iteration_s" in startup


def test_full_time_trains_past_the_target_to_the_cap_and_sb3_is_refused_it(tmp_path):
    files = JudgeFiles(str(tmp_path), time.monotonic())
    algo = _FakeAlgo(files, 21.0)
    race_atari.train_until(algo, files, race_atari.GAMES["pong"], 0.2, {}, full_time=True)
    assert algo.calls > race_atari.GAMES["pong"].window and time.monotonic() - files.start >= 0.2
    assert race_atari.reached(files.read(), 18.0)[1] == race_atari.GAMES["pong"].window * 100  # still judged
    with pytest.raises(ValueError, match="--full-time applies to the RLlib contenders"):
        race_atari.run_contender("SB3 PPO (zoo)", 0, 1.0, str(tmp_path), "cpu", full_time=True)
    assert not (tmp_path / "sb3-ppo-zoo-seed0").exists()  # refused before anything ran


def test_section_reports_each_contenders_start_as_a_median_over_seeds(tmp_path):
    for seed, built in ((0, 20.0), (1, 24.0), (2, 22.0)):
        _write_run(tmp_path, "FastDQN (ours)", [(100.0, 1000, -21.0)], seed=seed)
        meta_path = tmp_path / f"fastdqn-ours-seed{seed}" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["startup"] = {"ray_started_s": 5.0, "built_s": built, "first_iteration_s": built + 3}
        meta_path.write_text(json.dumps(meta))
    _write_run(tmp_path, "SB3 PPO (zoo)", [(100.0, 1000, -21.0)])  # SB3 runs record no start
    table = race_atari.section(str(tmp_path))
    assert ("- FastDQN (ours), start (seconds on the judge's clock; median over 3 seeds): Ray up 5.0, algorithm "
            "built 22.0, first iteration done 25.0") in table
    assert "SB3 PPO (zoo), start" not in table


def test_an_rllib_contender_starts_ray_with_its_algorithms_and_runners_modules_preloaded(tmp_path, monkeypatch,
                                                                                          ray_session):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    import ray

    import rl_speed.ray_start

    asked = []
    monkeypatch.setattr(rl_speed.ray_start, "init_local_ray", lambda preload, **kwargs: asked.append(preload))
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # (this session's Ray trains it and stays up)
    race_atari.run_contender("FastPPO (ours)", 0, 1.0, str(tmp_path), device="cpu",
                             overrides={"num_envs_per_env_runner": 2, "rollout_fragment_length": 8,
                                        "minibatch_size": 16, "num_epochs": 1})
    meta = json.loads((tmp_path / "fastppo-ours-seed0" / "meta.json").read_text())
    assert asked == [["rl_speed.algorithms.fast_ppo", "rl_speed.env_runners.batched"]]
    assert meta["ray_preload"] == asked[0] and meta["ran"] and meta["ray_beside_imports"]


@pytest.mark.parametrize("contender", sorted(race_atari.CONTENDER_MODULES))
def test_the_modules_named_before_the_imports_are_those_of_the_built_config(contender, tmp_path):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    from rl_speed.ray_start import preload_modules

    config = race_atari.rllib_contender_config(contender, JudgeFiles(str(tmp_path), 0.0), 0, "cpu")
    assert list(race_atari.CONTENDER_MODULES[contender]) == preload_modules([(config.algo_class, config)])
    assert set(race_atari.CONTENDER_MODULES) == set(race_atari.CONTENDERS) - set(race_atari.SB3_CONTENDERS)


def test_section_gives_each_runs_own_row_from_its_files(tmp_path):
    winning = [(100.0 + i, 1000 * (i + 1), 19.0) for i in range(25)]  # the last 20 reach 18 at game 20
    _write_run(tmp_path, "FastPPO (ours)", winning, seed=1)
    _write_run(tmp_path, "FastPPO (ours)", [(100.0, 1000, -21.0)], seed=0)
    folder = tmp_path / "fastppo-ours-seed1"
    meta = json.loads((folder / "meta.json").read_text())
    meta |= {"startup": {"first_iteration_s": 20.04}, "env_steps_sampled": 1_200_000, "seconds": 100.0}
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "evaluation.json").write_text(json.dumps({"0.25": {"greedy": [10.0, 12.0], "sampled": [9.0]},
                                                        "0.0": {"greedy": [21.0], "sampled": [20.0, 19.0]}}))
    rows = [line for line in race_atari.section(str(tmp_path)).splitlines() if line.startswith("| FastPPO (ours) | ")]
    assert rows[1:3] == ["| FastPPO (ours) | 0 | not reached |  |  |  |  |  |",  # rows[0]: the race table's row
                         "| FastPPO (ours) | 1 | 119.0 s | 20,000 | 20.0 s | 12.0k | 21.00 / 11.00 | 19.50 / 9.00 |"]


def test_section_gives_each_runs_env_steps_to_each_level(tmp_path):
    # game i scores -21 + i, at most 21, after 50,000 env steps a game: the last-20 mean after game i >= 19 is
    # i - 30.5 until the scores reach 21 at game 42
    climbing = [(10.0 * i, 50_000 * (i + 1), min(21.0, -21.0 + i)) for i in range(60)]
    _write_run(tmp_path, "FastPPO (ours)", climbing, seed=0)
    _write_run(tmp_path, "FastPPO (ours)", [(1.0, 1000, -21.0)] * 25, seed=1)
    folder = tmp_path / "fastppo-ours-seed0"
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta | {"overrides": {"lr": 0.0005}}))
    lines = race_atari.section(str(tmp_path)).splitlines()
    assert "| contender | seed | variant | -15 | -10 | 0 | 10 | 15 | 18 |" in lines
    rows = [line for line in lines if line.startswith("| FastPPO (ours) | ") and "`" in line]
    # -15 at the first full window (game 19), -10 at game 21, 0 at 31, 10 at 41; then 15 at 46 and 18 at 51, the
    # window holding scores of 21
    assert rows == ['| FastPPO (ours) | 0 | `{"lr": 0.0005}` | 1.00M | 1.10M | 1.60M | 2.10M | 2.35M | 2.60M |',
                    "| FastPPO (ours) | 1 | `preset` |  |  |  |  |  |  |"]


def test_a_run_under_cuda_mps_is_named_so_in_the_variant_column(tmp_path):
    _write_run(tmp_path, "FastPPO (ours)", [(1.0, 1000, -21.0)] * 25, seed=0)
    folder = tmp_path / "fastppo-ours-seed0"
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta | {"cuda_mps": True}))
    rows = [line for line in race_atari.section(str(tmp_path)).splitlines() if "`preset`" in line]
    assert rows == ["| FastPPO (ours) | 0 | `preset` under CUDA MPS |  |  |  |  |  |  |"]


def test_cuda_mps_without_its_daemon_is_refused_before_a_runs_files_are_replaced(tmp_path, monkeypatch, capsys):
    _write_run(tmp_path, "FastPPO (ours)", [(1.0, 1000, -21.0)] * 25, seed=0)
    before = sorted(p.name for p in (tmp_path / "fastppo-ours-seed0").iterdir())
    monkeypatch.setenv("PATH", str(tmp_path / "no-driver"))  # no nvidia-cuda-mps-control on it
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    status = race_atari.main(["contender", "FastPPO (ours)", "--seed", "0", "--dir", str(tmp_path), "--cuda-mps"])
    assert status == 2
    assert "`nvidia-cuda-mps-control` is not on PATH" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "fastppo-ours-seed0").iterdir()) == before


def test_a_races_rllib_contenders_get_its_full_time_checkpoint_and_evaluate_flags_and_sb3s_do_not():
    ours = race_atari.contender_command("FastPPO (ours)", 3, 600.0, "d", "cuda", "breakout", evaluate_games=16,
                                        full_time=True, checkpoint=True)
    assert ours[ours.index("contender"):] == [
        "contender", "FastPPO (ours)", "--seed", "3", "--seconds", "600.0", "--dir", "d", "--device", "cuda",
        "--game", "breakout", "--evaluate", "16", "--full-time", "--checkpoint"]
    sb3 = race_atari.contender_command("SB3 PPO (zoo)", 3, 600.0, "d", "cuda", "breakout", evaluate_games=16,
                                       full_time=True, checkpoint=True)
    assert sb3[-2:] == ["--game", "breakout"]  # SB3 stops at the target and keeps no algorithm
    plain = race_atari.contender_command("FastDQN (ours)", 0, 60.0, "d", "cpu", "pong")
    assert plain[-2:] == ["--game", "pong"]


def test_a_races_config_reaches_every_contenders_command():
    config = {"env_config": {"repeat_action_probability": 0.25}}
    for contender in ("FastPPO (ours)", "SB3 PPO (zoo)"):
        command = race_atari.contender_command(contender, 0, 60.0, "d", "cpu", "pong", overrides=config)
        assert command[command.index("--config") + 1] == json.dumps(config)
    assert "--config" not in race_atari.contender_command("FastPPO (ours)", 0, 60.0, "d", "cpu", "pong")


@pytest.mark.parametrize("contenders, config, message", [
    (("FastPPO (ours)", "SB3 PPO (zoo)"), {"lr": 0.001}, "SB3 PPO \\(zoo\\) runs rl-zoo's settings"),
    (("FastPPO (ours)",), {"lr_typo": 0.001}, "`lr_typo` is not a config key of FastPPO"),
])
def test_a_race_with_config_a_contender_cannot_take_is_refused_before_any_run(tmp_path, monkeypatch, contenders,
                                                                              config, message):
    if "lr_typo" in config:  # checked on the contender's preset, which names an Atari env
        pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    monkeypatch.setattr(race_atari, "run_pool", lambda *args: pytest.fail("a run started"))
    with pytest.raises(ValueError, match=message):
        race_atari.run(1, "cpu", 60.0, str(tmp_path), None, contenders, overrides=config)
    assert list(tmp_path.iterdir()) == []


def test_a_race_under_cuda_mps_runs_its_contenders_under_a_daemon_of_its_own_and_quits_it(tmp_path, monkeypatch):
    driver = tmp_path / "driver"  # a stand-in for NVIDIA's control program: starts by making its pipe, logs its quit
    driver.mkdir()
    control = driver / "nvidia-cuda-mps-control"
    control.write_text('#!/bin/sh\nif [ "$1" = -d ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi\n'
                       f'cat >> {tmp_path}/told; rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"\n')
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{driver}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    seen = []
    monkeypatch.setattr(race_atari, "run", lambda *args: seen.append(race_atari.running_daemon()) or "")
    assert race_atari.main(["race", "--contenders", "FastPPO (ours)", "--dir", str(tmp_path), "--cuda-mps"]) == 0
    (pipes,) = seen  # run_pool starts the contenders with os.environ, which names the daemon during the race
    assert pipes is not None and pipes.name == "pipe"
    assert (tmp_path / "told").read_text() == "quit\n"  # quit after the race, its folder removed
    assert not pipes.exists() and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_race_under_cuda_mps_without_its_daemon_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "no-driver"))  # no nvidia-cuda-mps-control on it
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(race_atari, "run", lambda *args: pytest.fail("the race started"))
    assert race_atari.main(["race", "--contenders", "FastPPO (ours)", "--dir", str(tmp_path), "--cuda-mps"]) == 2
    assert "`nvidia-cuda-mps-control` is not on PATH" in capsys.readouterr().err


def test_the_race_command_passes_full_time_and_checkpoint_to_the_race(monkeypatch):
    calls = []
    monkeypatch.setattr(race_atari, "run", lambda *args: calls.append(args) or "table")
    race_atari.main(["race", "--game", "breakout", "--contenders", "FastPPO (ours)", "--first-seed", "1",
                     "--repeats", "4", "--full-time", "--checkpoint", "--missing-only", "--config", '{"lr": 0.001}'])
    (repeats, _, _, _, _, contenders, first_seed, game, missing_only, _, full_time, checkpoint, config), = calls
    assert (repeats, contenders, first_seed, game, missing_only, full_time, checkpoint, config) == (
        4, ("FastPPO (ours)",), 1, "breakout", True, True, True, {"lr": 0.001})


def test_an_sb3_contender_asked_to_keep_its_algorithm_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="--checkpoint saves an RLlib algorithm; SB3 DQN \\(zoo\\) has none"):
        race_atari.run_contender("SB3 DQN (zoo)", 0, 1.0, str(tmp_path), "cpu", checkpoint=True)
    assert not (tmp_path / "sb3-dqn-zoo-seed0").exists()
