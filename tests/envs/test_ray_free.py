"""The simulators must import with numpy and gymnasium only: never ray, never torch."""

import subprocess
import sys

CODE = """
import sys
import rl_speed_envs, rl_speed_envs.snake, rl_speed_envs.counter_rng, rl_speed_envs.durotaxis
import rl_speed_envs.grid_arena, rl_speed_envs.memory, rl_speed_envs.frames, rl_speed_envs.mario
rl_speed_envs.register_gymnasium()
env = rl_speed_envs.SnakeVectorEnv(num_envs=4, flood_fill=True)
env.reset(seed=0)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "torch"))
print("HEAVY:" + ",".join(heavy))
"""


def test_envs_import_without_ray_or_torch():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout
    assert "HEAVY:\n" in out, out


def test_importing_rl_speed_is_light():
    code = "import sys, rl_speed; print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
