"""`rl-speed bench atari-emulators`: ale-py's Pong and Breakout emulators alone on one thread and on every usable
CPU."""

from __future__ import annotations

import pytest

from benchmarks.throughput import atari_emulators

pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")


# (ale-py builds and seeds an emulator in about 0.2 s on a 2-core VM, so these tests give a thread 2 of them)


def test_a_thread_steps_its_emulators_and_the_rates_count_every_emulator():
    assert atari_emulators.LANES_PER_THREAD == 16  # as a runner of the GPU presets
    env = atari_emulators.emulators(threads=2, lanes_per_thread=2)
    try:
        assert env.num_envs == 4
        rate = atari_emulators.env_steps_per_second(env, seconds=0.3)
        assert rate > 100  # 4 emulators' frame-skipped steps per second, not 4 of them per step counted once
    finally:
        env.close()


def test_one_thread_and_every_thread_of_each_game_get_a_row():
    rates = atari_emulators.measure(repeats=1, seconds=0.2, threads=2, lanes_per_thread=2)
    assert sorted(rates) == [("breakout", 1), ("breakout", 2), ("pong", 1), ("pong", 2)]
    assert all(rate > 0 for rate in rates.values())


def test_the_game_asked_for_is_the_one_emulated():
    env = atari_emulators.emulators(threads=1, lanes_per_thread=1, game="breakout")
    try:
        assert env.single_action_space.n == 4  # Breakout's minimal action set; Pong's has 6
    finally:
        env.close()
