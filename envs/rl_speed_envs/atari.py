"""Atari 2600 games through ale-py (optional extra ``[atari]``; ale-py ships the ROMs, so nothing is downloaded).

:class:`AtariVectorEnv` is ale-py's own C++ vector env (``ale_py.AtariVectorEnv``: emulators stepped on its thread
pool) with the standard preprocessing done in C++: frame skip 4 with max-pooling of the last two frames, 84 x 84
grayscale, a stack of the last 4 frames, up to 30 no-op starts, FIRE on reset where the game needs it, rewards
clipped to {-1, 0, 1}, sticky actions off (``repeat_action_probability`` 0, as in the Nature DQN setup; ALE v5's own
default is 0.25). Observations come as ``[84, 84, 4]`` uint8 (frames on the last axis, RLlib's image layout; ale-py
gives ``[4, 84, 84]`` and the env transposes once per step) and stay uint8 up to the module. NEXT_STEP autoreset,
as rl_speed's runners expect. :class:`AtariEnv` is one emulator behind the same preprocessing, for stock RLlib and
RLlib's own ``sample()`` (evaluation).

``env_config`` keys (:data:`CONFIG_KEYS`), checked before anything starts: ``game`` (ale-py's ROM name, e.g.
``pong``, ``breakout``; ``ALE/Pong-v5`` is accepted too), ``frameskip``, ``stack_num``, ``noop_max``,
``repeat_action_probability``, ``reward_clipping``, ``episodic_life``, ``life_episodes`` (below),
``use_fire_reset``, ``full_action_space``, ``max_num_frames_per_episode``, ``num_threads`` (ale-py's threads per
vector env; default 1, the one CPU Ray gives an env runner), ``lane_groups`` (default 1; see below).

Two ways to end an episode at a lost life, for games with lives (Breakout): ale-py's ``episodic_life`` ends the
episode **and starts a new game**, so an agent never plays past its first life; ``life_episodes: true`` ends the
episode and **continues the game** (SB3's and CleanRL's ``EpisodicLifeEnv``): the next episode starts from the frame
after the lost life (its first step, a reset step of the NEXT_STEP protocol, plays a no-op whose reward is not
given), and a new game starts only at game over. Either way the value target stops at a lost life. The two cannot be
combined.

Every step's ``info`` holds the game's own view, for judges that count whole games: ``game_reward`` (the unclipped
reward of each lane's current game, also on steps whose training reward is withheld) and ``game_over`` (the game
ended at this step: every episode end, except a lost life under ``life_episodes``).

``lane_groups: k`` splits the ``num_envs`` emulators into k equal groups, each its own ale-py vector env with its own
thread(s), which can be stepped apart: :meth:`AtariVectorEnv.send_group` starts a group's step and returns at once,
:meth:`AtariVectorEnv.recv_group` waits for it. rl_speed's env runner then computes one group's actions while the
other group's emulators run (:mod:`rl_speed.env_runners.overlapped`); ``step()`` sends every group, then receives
them, so the groups also emulate side by side there. Seeds, observations and episodes are those of one vector env
of ``num_envs`` (group g holds lanes ``g * num_envs / k`` onwards).

A seeded reset reloads every emulator's ROM (ale-py applies a seed only then): about 0.11 s an emulator, 1.8 s for a
runner's 16, against 6 ms unseeded. :meth:`AtariVectorEnv.prefetch_reset` starts it in a thread (ale-py releases the
GIL while it runs) so a runner builds its module and reports ready meanwhile; the next ``reset`` with that seed
takes its result.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

DEFAULTS = {"game": "pong", "frameskip": 4, "stack_num": 4, "noop_max": 30, "repeat_action_probability": 0.0,
            "reward_clipping": True, "episodic_life": False, "use_fire_reset": True, "full_action_space": False,
            "max_num_frames_per_episode": 108_000, "num_threads": 1, "lane_groups": 1, "life_episodes": False}
CONFIG_KEYS = tuple(DEFAULTS)


def install_hint() -> str:
    return "Atari needs ale-py (the [atari] extra; its wheels include the ROMs): python -m pip install 'rl_speed[atari]'"


def check_installed() -> None:
    """Raises ``ImportError`` with :func:`install_hint` if ale-py is missing (used at configuration time)."""
    try:
        import ale_py  # noqa: F401
    except ImportError:
        raise ImportError(install_hint()) from None


def rom_name(game: str) -> str:
    """``"ALE/Pong-v5"`` / ``"Pong"`` / ``"pong"`` -> ale-py's ROM name ``"pong"`` (``SpaceInvaders`` ->
    ``space_invaders``)."""
    name = game.split("/")[-1].split("-v")[0]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def check_config(settings: dict) -> dict:
    """``settings`` merged over :data:`DEFAULTS`; raises ``ValueError`` naming the first bad key or value."""
    unknown = sorted(set(settings) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"Atari: unknown env_config keys {unknown}; accepted: {', '.join(CONFIG_KEYS)}.")
    cfg = {**DEFAULTS, **settings}
    if not isinstance(cfg["game"], str) or not cfg["game"]:
        raise ValueError(f"Atari: `game` must be a game name such as 'pong' or 'ALE/Pong-v5', got {cfg['game']!r}.")
    for key in ("frameskip", "stack_num", "num_threads", "max_num_frames_per_episode", "lane_groups"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"Atari: `{key}` must be an integer >= 1, got {cfg[key]!r}.")
    if not isinstance(cfg["noop_max"], int) or cfg["noop_max"] < 0:
        raise ValueError(f"Atari: `noop_max` must be an integer >= 0, got {cfg['noop_max']!r}.")
    if cfg["episodic_life"] and cfg["life_episodes"]:
        raise ValueError("Atari: `episodic_life` and `life_episodes` both end an episode at a lost life; choose one: "
                         "`episodic_life` (ale-py's) starts a new game there, `life_episodes` continues the game.")
    if not 0.0 <= float(cfg["repeat_action_probability"]) <= 1.0:
        raise ValueError("Atari: `repeat_action_probability` must be in [0, 1], got "
                         f"{cfg['repeat_action_probability']!r}.")
    return cfg


def _check_lane_groups(num_envs: int, groups: int) -> None:
    if num_envs % groups:
        raise ValueError(f"Atari: `lane_groups`={groups} must divide the {num_envs} envs of a runner "
                         "(num_envs_per_env_runner) into equal groups.")


class AtariVectorEnv(VectorEnv):
    """``num_envs`` emulators of one game (see the module docstring)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    @staticmethod
    def check_lanes(num_envs: int, settings: dict) -> dict:
        """Checks, without building anything, what depends on a runner's ``num_envs`` (``lane_groups``); returns
        the settings whose rest one emulator can check (:func:`rl_speed.registry.check_env_config`), where building
        ``num_envs`` emulators at configuration time would take about 0.1 s each."""
        _check_lane_groups(int(num_envs), check_config(settings)["lane_groups"])
        return {key: value for key, value in settings.items() if key != "lane_groups"}

    def __init__(self, num_envs: int = 1, **config: Any) -> None:
        check_installed()
        import ale_py

        cfg = check_config(config)
        game = rom_name(cfg["game"])
        groups = cfg["lane_groups"]
        _check_lane_groups(int(num_envs), groups)
        size = int(num_envs) // groups
        self._groups = []
        try:
            for _ in range(groups):
                self._groups.append(ale_py.AtariVectorEnv(
                    game, size, num_threads=min(cfg["num_threads"], size), frameskip=cfg["frameskip"],
                    stack_num=cfg["stack_num"], noop_max=cfg["noop_max"],
                    repeat_action_probability=float(cfg["repeat_action_probability"]),
                    reward_clipping=False, episodic_life=bool(cfg["episodic_life"]),  # clipped here: see recv_group
                    use_fire_reset=bool(cfg["use_fire_reset"]), full_action_space=bool(cfg["full_action_space"]),
                    max_num_frames_per_episode=cfg["max_num_frames_per_episode"], img_height=84, img_width=84,
                    grayscale=True, maxpool=True, autoreset_mode=AutoresetMode.NEXT_STEP))
        except Exception as e:  # ale-py's message for an unknown ROM lists nothing; say what was asked for
            raise ValueError(f"Atari: ale-py could not start game {game!r} (from `game`={cfg['game']!r}): {e}") from e
        self.num_envs = int(num_envs)
        self.lane_groups = groups
        self.group_size = size
        self._clip = bool(cfg["reward_clipping"])
        self._life_episodes = bool(cfg["life_episodes"])
        self._lives = np.zeros(self.num_envs, np.int64)  # each lane's lives after its last step
        # life_episodes: the lane's last step ended an episode at a lost life (its next step plays a no-op and
        # starts the next episode of the same game) / ended the game during that no-op (its next step, ale-py's
        # restart, ends the episode the no-op began)
        self._continuing = np.zeros(self.num_envs, bool)
        self._ended_in_noop = np.zeros(self.num_envs, bool)
        self._noop_terminated = np.zeros(self.num_envs, bool)  # how that game ended (else: the frame cap)
        self._infos: list[dict] = [{} for _ in range(groups)]
        stack = cfg["stack_num"]
        self.single_observation_space = spaces.Box(0, 255, (84, 84, stack), np.uint8)
        self.single_action_space = spaces.Discrete(int(self._groups[0].single_action_space.n))
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._prefetched: tuple[int | None, threading.Thread, dict] | None = None

    def prefetch_reset(self, seed: int | None = None) -> None:
        """Starts ``reset(seed=seed)`` in a thread and returns at once. The next ``reset`` with this seed returns its
        result; any other call on the env waits for it first."""
        self._await_prefetched()
        out: dict = {}

        def run() -> None:
            try:
                out["reset"] = self._reset(seed)
            except BaseException as e:  # raised again to the caller of the next reset
                out["error"] = e

        thread = threading.Thread(target=run, name="atari-prefetch-reset", daemon=True)
        thread.start()
        self._prefetched = (seed, thread, out)

    def _await_prefetched(self) -> tuple[int | None, tuple] | None:
        """Waits for a prefetched reset: its seed and result, or None if none was started since the last call."""
        if self._prefetched is None:
            return None
        seed, thread, out = self._prefetched
        self._prefetched = None
        thread.join()
        if "error" in out:
            raise out["error"]
        return seed, out["reset"]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if options:
            raise ValueError(f"Atari: reset() takes no options (got {sorted(options)}); every lane is reset. Reset "
                             "without options.")
        prefetched = self._await_prefetched()
        if prefetched is not None and prefetched[0] == seed:
            return prefetched[1]
        return self._reset(seed)

    def _reset(self, seed: int | None) -> tuple[np.ndarray, dict]:
        obs, lives = [], []
        for g, group in enumerate(self._groups):  # consecutive seeds over all lanes, as one vector env
            group_obs, info = group.reset(seed=None if seed is None else seed + g * self.group_size)
            obs.append(group_obs)
            lives.append(info["lives"])
        self._lives[:] = _join(lives)
        self._continuing[:] = self._ended_in_noop[:] = self._noop_terminated[:] = False
        return _channels_last(_join(obs)), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = np.asarray(actions, np.int64).reshape(self.num_envs)
        size = self.group_size
        for g in range(self.lane_groups):
            self.send_group(g, actions[g * size:(g + 1) * size])
        parts = [self.recv_group(g) for g in range(self.lane_groups)]
        info = {key: _join([i[key] for i in self._infos]) for key in ("game_reward", "game_over")}
        return (*(_join(column) for column in zip(*parts)), info)

    def send_group(self, group: int, actions: Any) -> None:
        """Starts one step of lane group ``group`` (its ``group_size`` actions); returns without waiting."""
        actions = np.asarray(actions, np.int64).reshape(self.group_size)
        if self._prefetched is not None:  # stepped without taking the prefetched reset: the emulators were reset
            self._await_prefetched()
        if self._life_episodes:  # an episode that continues a game after a lost life starts with a no-op
            actions = np.where(self._continuing[self._lanes(group)], 0, actions)
        self._groups[group].send(actions)

    def group_info(self, group: int) -> dict:
        """The ``game_reward`` and ``game_over`` of the step :meth:`recv_group` last received for lane group
        ``group`` (``step()``'s info, for that group's lanes)."""
        return self._infos[group]

    def recv_group(self, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Waits for the step :meth:`send_group` started: the group's observations, rewards (clipped to their sign
        with ``reward_clipping``), terminateds and truncateds."""
        obs, game_reward, ale_terminated, ale_truncated, info = self._groups[group].recv()
        lanes = self._lanes(group)
        game_reward = np.asarray(game_reward, np.float32)
        ale_terminated = np.asarray(ale_terminated, bool)
        terminated, truncated = ale_terminated, np.asarray(ale_truncated, bool)
        game_over = terminated | truncated
        rewards = np.sign(game_reward) if self._clip else game_reward.copy()
        if self._life_episodes:
            lives = np.asarray(info["lives"], np.int64)
            noop = self._continuing[lanes]  # the no-op that starts an episode after a lost life (a reset step)
            restart = self._ended_in_noop[lanes]  # ale-py's restart after a game that ended in that no-op
            lost_life = (lives < self._lives[lanes]) & ~game_over & ~noop & ~restart
            rewards[noop | restart] = 0.0
            # A game that ended in the no-op is over for the judge there, and the episode the no-op began ends at
            # the next step, ale-py's restart (a reset step cannot end an episode).
            terminated = np.where(restart, self._noop_terminated[lanes], terminated | lost_life) & ~noop
            truncated = np.where(restart, ~self._noop_terminated[lanes], truncated) & ~noop
            game_reward[restart] = 0.0  # the restart step belongs to no game
            game_over = game_over & ~restart
            self._ended_in_noop[lanes] = noop & game_over
            self._noop_terminated[lanes] = noop & ale_terminated
            self._continuing[lanes] = lost_life | restart
            self._lives[lanes] = lives
        self._infos[group] = {"game_reward": game_reward, "game_over": game_over}
        return _channels_last(obs), rewards, terminated, truncated  # float32, as ale-py's rewards

    def _lanes(self, group: int) -> slice:
        return slice(group * self.group_size, (group + 1) * self.group_size)

    def close_extras(self, **kwargs: Any) -> None:
        if getattr(self, "_prefetched", None) is not None:
            self._prefetched[1].join()  # its emulators are closed below; its result (or error) is not wanted
        for group in getattr(self, "_groups", ()):  # (empty if ale-py refused the game)
            group.close()


class AtariEnv(gym.Env):
    """One emulator with :class:`AtariVectorEnv`'s preprocessing (see the module docstring)."""

    config_keys = CONFIG_KEYS
    check_installed = staticmethod(check_installed)

    def __init__(self, **config: Any) -> None:
        if check_config(config)["lane_groups"] != 1:
            raise ValueError(f"Atari: `lane_groups`={config['lane_groups']} splits the emulators of rl_speed's vector "
                             "env (FastPPO, FastDQN); this one-emulator form (stock RLlib's env runners, evaluation "
                             "with RLlib's sample()) has one lane. Remove `lane_groups` or run FastPPO / FastDQN.")
        self._vector = AtariVectorEnv(1, **config)
        self.observation_space = self._vector.single_observation_space
        self.action_space = self._vector.single_action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs, _ = self._vector.reset(seed=seed, options=options)  # which refuses options rather than ignore them
        return obs[0], {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, rewards, terminated, truncated, info = self._vector.step(np.array([action]))
        return (obs[0], float(rewards[0]), bool(terminated[0]), bool(truncated[0]),
                {"game_reward": float(info["game_reward"][0]), "game_over": bool(info["game_over"][0])})

    def close(self) -> None:
        self._vector.close()


def _join(parts: list | tuple) -> np.ndarray:
    """The lane groups' arrays as one, in lane order; a single group's array as it is (no copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _channels_last(obs: np.ndarray) -> np.ndarray:
    """ale-py's ``[N, stack, 84, 84]`` as ``[N, 84, 84, stack]``: one strided copy per stacked frame, about 5x
    faster than numpy's copy of the whole transposed view (0.14 against 0.76 ms for 16 lanes on a 2-core EPYC),
    which walks the source with a stride of a whole frame."""
    out = np.empty((obs.shape[0], *obs.shape[2:], obs.shape[1]), obs.dtype)
    for k in range(obs.shape[1]):
        out[..., k] = obs[:, k]
    return out
