"""Every tuned example parses and passes its algorithm's validation (without starting Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rl_speed
from rl_speed.experiments import load_experiments

EXAMPLES = sorted((Path(__file__).parents[2] / "tuned_examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_tuned_example_validates(path):
    if "SuperMarioBros" in path.read_text():  # validation checks that the emulator is installed (clear error if not)
        pytest.importorskip("gym_super_mario_bros", reason="the [mario] extra is not installed (CI installs it; "
                            "locally: python3 tasks.py mario-setup)")
    if "MettaGrid" in path.read_text():
        pytest.importorskip("mettagrid", reason="the [mettagrid] extra is not installed")
    if "rl_speed/Atari-v0" in path.read_text():
        pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    rl_speed.register()
    (experiment, *_) = load_experiments(path)
    assert experiment.config.env is not None


def test_rl_module_short_name_selects_the_recurrent_module():
    from rl_speed.modules.recurrent import RecurrentActorCritic

    (experiment,) = load_experiments(Path(__file__).parents[2] / "tuned_examples" / "grid_ppo_gpu.yaml")
    assert experiment.config.rl_module_spec.module_class is RecurrentActorCritic
