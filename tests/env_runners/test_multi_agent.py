"""MultiAgentBatchedEnvRunner: the lane layout of multi-agent columns, masks for agents that end early, module
ownership, RLlib's multi-agent metric keys, and the config-time refusals (turn-based envs, mixed spaces, ...)."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch
import tree

from ray.rllib.env.multi_agent_env import MultiAgentEnv

from rl_speed import columns as C
from rl_speed.algorithms.fast_dqn import FastDQNConfig
from rl_speed.algorithms.fast_ppo import FastPPOConfig
from rl_speed.columns import split_lanes
from rl_speed.env_runners.multi_agent import MultiAgentBatchedEnvRunner

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # remote runners build these test envs


class Countdown(MultiAgentEnv):
    """Agent ``k`` lives ``k + 2`` steps, then terminates; reward 1 per step plus ``k`` on its last; the episode
    ends when all agents are done. Observation: [agent index, steps so far]."""

    def __init__(self, config=None):
        super().__init__()
        self.agents = self.possible_agents = ["a0", "a1", "a2"]
        space = gym.spaces.Box(0, 100, (2,), np.float32)
        self.observation_spaces = {aid: space for aid in self.agents}
        self.action_spaces = {aid: gym.spaces.Discrete(2) for aid in self.agents}
        self.t = 0

    def _obs(self, aid):
        return np.array([int(aid[1]), self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {aid: self._obs(aid) for aid in self.possible_agents}, {}

    def step(self, actions):
        self.t += 1
        obs, rewards, terminateds = {}, {}, {}
        for aid in actions:
            k = int(aid[1])
            done = self.t >= k + 2
            obs[aid], rewards[aid], terminateds[aid] = self._obs(aid), 1.0 + (k if done else 0.0), done
        terminateds["__all__"] = self.t >= 4
        return obs, rewards, terminateds, {"__all__": False}, {}


class TakeTurns(MultiAgentEnv):
    """Two players move in turns, "a" first, 5 moves in all. A move earns the mover 0.1 and the waiting player 1.0;
    after the last move (a's) both observe, a gets +10 and b -10. Observation: [player, moves so far]."""

    def __init__(self, config=None):
        super().__init__()
        self.agents = self.possible_agents = ["a", "b"]
        self.observation_spaces = {aid: gym.spaces.Box(0, 100, (2,), np.float32) for aid in self.agents}
        self.action_spaces = {aid: gym.spaces.Discrete(2) for aid in self.agents}
        self.t = 0

    def _obs(self, aid):
        return np.array([self.agents.index(aid), self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {"a": self._obs("a")}, {}

    def step(self, actions):
        (mover,) = actions
        other = "b" if mover == "a" else "a"
        self.t += 1
        rewards = {mover: 0.1, other: 1.0}
        if self.t == 5:
            rewards = {"a": rewards["a"] + 10.0, "b": rewards["b"] - 10.0}
            return ({aid: self._obs(aid) for aid in self.agents}, rewards, {"__all__": True}, {"__all__": False},
                    {})
        return {other: self._obs(other)}, rewards, {"__all__": False}, {"__all__": False}, {}


def ma_config(env=Countdown, **policies):
    mapping = policies.pop("mapping", lambda aid, episode, **kw: "odd" if aid == "a1" else "even")
    return (FastPPOConfig().environment(env)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=10)
            .multi_agent(policies={"even", "odd"}, policy_mapping_fn=mapping, **policies)
            .training(train_batch_size_per_learner=60, minibatch_size=20, num_epochs=1)
            .rl_module(model_config={"fcnet_hiddens": [8]}))


def test_lanes_masks_modules_and_episode_metrics(ray_session):
    config = ma_config()
    config.validate()
    assert config.env_runner_cls is MultiAgentBatchedEnvRunner  # swapped in for multi-agent configs
    runner = MultiAgentBatchedEnvRunner(config=config)
    try:
        cols = runner.sample_columns()
        C.check(cols)
        t, lanes = cols[C.REWARDS].shape
        assert (t, lanes) == (10, 6)  # 2 copies x 3 agents; lane i * 3 + k is agent k of copy i
        # Episodes take 4 steps plus one reset step: steps 0-3 are episode 1, step 4 the reset, 5-8 episode 2.
        # Agent k acts on steps 0..k+1 of each episode (k + 2 steps), then is masked until the next episode.
        for k in range(3):
            acted = np.array([s < k + 2 for s in range(4)] + [False] + [s < k + 2 for s in range(4)] + [False])
            for copy in range(2):
                lane = copy * 3 + k
                assert cols[C.VALID][:, lane].tolist() == acted.tolist(), (k, copy)
                ends = np.flatnonzero(cols[C.TERMINATEDS][:, lane])
                assert ends.tolist() == [k + 1, k + 6]  # its own termination, never the copy's end for it
                assert cols[C.REWARDS][k + 1, lane] == 1.0 + k
                assert not cols[C.TRUNCATEDS][:, lane].any()
        # obs[t] is what the agent saw; the step after a termination holds its final observation
        assert cols[C.OBS][2, 1].tolist() == [1.0, 2.0]  # agent a1, copy 0, after 2 steps
        # module ownership: a1 -> "odd" (index 1 of the sorted ids), a0/a2 -> "even" (index 0)
        assert (cols[C.MODULE][:, [1, 4]] == 1).all() and (cols[C.MODULE][:, [0, 2, 3, 5]] == 0).all()
        assert cols[C.ACTION_LOGP].shape == (10, 6)
        metrics = tree.map_structure(lambda stat: stat.peek(), runner.get_metrics())
        # 2 episodes finished per copy: return = 2 (a0) + 4 (a1) + 6 (a2) = 12 summed over agents, 4 env steps long
        assert metrics["episode_return_mean"] == pytest.approx(12.0)
        assert metrics["episode_len_mean"] == pytest.approx(4.0)
        assert metrics["agent_episode_returns_mean"]["a2"] == pytest.approx(6.0)
        assert metrics["module_episode_returns_mean"]["even"] == pytest.approx(8.0)
        assert metrics["num_env_steps_sampled"] == 16  # 2 copies x 8 real env steps (reset steps excluded)
        # env steps in the columns: one mark per copy per real env step, on the copy's first lane
        assert C.num_env_steps(cols) == 16 and C.num_steps(cols) == 2 * 2 * (2 + 3 + 4)  # agent steps
        assert not cols[C.ENV_STEP][:, [1, 2, 4, 5]].any()
        assert (cols[C.ENV_STEP][:, 0] == (np.arange(10) % 5 != 4)).all()
        assert metrics["num_agent_steps_sampled"]["a0"] == 8
        assert metrics["num_module_steps_sampled"]["even"] == 8 + 16
        assert metrics["num_episodes"] == 4
        assert metrics["env_step_timer"] > 0 and metrics["rlmodule_inference_timer"] > 0  # RLlib's keys, s per step
        assert not cols[C.VALID][9].any()  # the reset step after episode 2
        more = runner.sample_columns()  # continues: episode 3 starts at the first step of the next call
        assert more[C.VALID][0].all() and (more[C.OBS][0, :, 1] == 0).all()
    finally:
        runner.stop()


def test_policy_mapping_per_episode(ray_session):
    """The mapping is asked once per agent per episode; a changed mapping takes effect at the next episode, and the
    reset step after an episode still belongs to the ended one."""
    episodes: list = []

    def mapping(aid, episode, **kw):
        if episode.id_ not in episodes:
            episodes.append(episode.id_)
        n = episodes.index(episode.id_) + 1  # copy 0 plays episodes 1, 3, 5; copy 1 plays 2, 4
        return "odd" if n % 4 in (1, 2) else "even"

    config = ma_config(mapping=mapping)
    config.validate()
    runner = MultiAgentBatchedEnvRunner(config=config)
    try:
        cols = runner.sample_columns()
        odd, even = 1, 0  # indices into the sorted module ids
        assert cols[C.MODULE][:5, :3].tolist() == [[odd] * 3] * 5  # episode 1 of copy 0 and its reset step
        assert cols[C.MODULE][5:10, :3].tolist() == [[even] * 3] * 5  # episode 3 and its reset step
        assert cols[C.MODULE][10, :3].tolist() == [odd] * 3  # obs[T]: the first observation of episode 5
        assert cols[C.MODULE][:5, 3:].tolist() == [[odd] * 3] * 5  # copy 1, episode 2
    finally:
        runner.stop()


def _turns_config(fragment: int):
    return (ma_config(TakeTurns, mapping=lambda aid, episode, **kw: "odd" if aid == "b" else "even")
            .env_runners(num_envs_per_env_runner=1, rollout_fragment_length=fragment))


def test_turn_based_env_writes_each_agents_transitions_to_the_step_it_acted_in(ray_session):
    config = _turns_config(6)
    config.validate()  # FastPPO takes turn-based envs
    runner = MultiAgentBatchedEnvRunner(config=config)
    try:
        cols = runner.sample_columns()
        C.check(cols)
        a, b = 0, 1
        assert np.flatnonzero(cols[C.VALID][:, a]).tolist() == [0, 2, 4]  # moves 1, 3, 5; step 5 resets
        assert np.flatnonzero(cols[C.VALID][:, b]).tolist() == [1, 3]
        # Each move's reward: the mover's 0.1 plus what arrives while it waits (1.0 per opponent move, +-10 at
        # the end); b's first move also carries the 1.0 it got before it ever moved.
        assert cols[C.REWARDS][[0, 2, 4], a] == pytest.approx([1.1, 1.1, 10.1])
        assert cols[C.REWARDS][[1, 3], b] == pytest.approx([2.1, -8.9])
        assert np.flatnonzero(cols[C.TERMINATEDS][:, a]).tolist() == [4]
        assert np.flatnonzero(cols[C.TERMINATEDS][:, b]).tolist() == [3]  # the end reaches b's last move
        assert cols[C.NEXT_ROW][[0, 2], a].tolist() == [2, 4] and cols[C.NEXT_ROW][[1, 3], b].tolist() == [3, 5]
        assert cols[C.OBS][3, b].tolist() == [1.0, 3.0]  # b's move-4 observation, its next after row 1
        assert cols[C.OBS][5, b].tolist() == [1.0, 5.0]  # its final observation
        metrics = tree.map_structure(lambda stat: stat.peek(), runner.get_metrics())
        assert metrics["agent_episode_returns_mean"]["a"] == pytest.approx(12.3)
        assert metrics["agent_episode_returns_mean"]["b"] == pytest.approx(-6.8)
    finally:
        runner.stop()


def test_turn_based_gae_equals_gae_over_each_agents_own_steps():
    from rl_speed.gae import vectorized_gae

    gamma, lam = 0.9, 0.8
    runner = MultiAgentBatchedEnvRunner(config=_turns_config(6))
    try:
        cols = runner.sample_columns()
    finally:
        runner.stop()
    values = torch.arange(1.0, 15.0).reshape(7, 2)  # any values: one per row and lane
    adv, _ = vectorized_gae(values, torch.tensor(cols[C.REWARDS]), torch.tensor(cols[C.TERMINATEDS]),
                            torch.tensor(cols[C.TRUNCATEDS]), torch.tensor(cols[C.VALID]), gamma=gamma,
                            lambda_=lam, next_row=torch.tensor(cols[C.NEXT_ROW]))
    for lane, rows in ((0, [0, 2, 4]), (1, [1, 3])):
        expected, carry = {}, 0.0  # RLlib's GAE over the agent's own episode: its steps only, ending terminated
        for k in reversed(range(len(rows))):
            row, last = rows[k], k == len(rows) - 1
            following = 0.0 if last else float(values[rows[k + 1], lane])
            delta = float(cols[C.REWARDS][row, lane]) + gamma * following - float(values[row, lane])
            carry = delta + (0.0 if last else gamma * lam * carry)
            expected[row] = carry
        assert [float(adv[r, lane]) for r in rows] == pytest.approx([expected[r] for r in rows], rel=1e-5)


def test_turn_based_transition_still_open_at_the_rollout_end_is_not_trained_on(ray_session):
    runner = MultiAgentBatchedEnvRunner(config=_turns_config(4))
    try:
        first, second = runner.sample_columns(), runner.sample_columns()
        # b moved at step 3 and observes only in the next rollout: dropped (RLlib's runner would move it there)
        assert np.flatnonzero(first[C.VALID][:, 1]).tolist() == [1]
        assert np.flatnonzero(first[C.VALID][:, 0]).tolist() == [0, 2]  # a's move at 2 closed at step 3
        # the next rollout: a moves (step 4 of the episode), the end reaches a; b's dropped move gets nothing
        assert second[C.VALID][0].tolist() == [True, False] and second[C.TERMINATEDS][0, 0]
        assert not second[C.TERMINATEDS][:2, 1].any() and second[C.REWARDS][:2, 1].sum() == pytest.approx(0.0)
        assert not second[C.VALID][1].any()  # the reset step; then b's first move of the next episode carries 1.1
        assert second[C.REWARDS][3, 1] == pytest.approx(1.1)
        metrics = tree.map_structure(lambda stat: stat.peek(), runner.get_metrics())
        assert metrics["agent_episode_returns_mean"]["b"] == pytest.approx(-6.8)  # the metrics see everything
    finally:
        runner.stop()


def test_fast_ppo_trains_a_turn_based_env(ray_session):
    algo = _turns_config(20).training(train_batch_size_per_learner=20, minibatch_size=10).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["env_runners"]["agent_episode_returns_mean"]["a"] == pytest.approx(12.3)
        assert np.isfinite(result["learners"]["odd"]["policy_loss"])
    finally:
        algo.stop()


@pytest.mark.parametrize("config, message", [
    (lambda: (FastDQNConfig().environment(TakeTurns)
              .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, ep, **kw: "p")),
     r"FastDQN: after reset, agents \['b'\] have no observation.*turn-based.*FastPPO trains turn-based envs"),
])
def test_config_refuses_what_columns_cannot_hold(config, message):
    with pytest.raises(ValueError, match=message):
        config().validate()


def test_config_refusals_name_the_key():
    with pytest.raises(ValueError, match="count_steps_by"):
        ma_config(count_steps_by="agent_steps").validate()
    with pytest.raises(ValueError, match="algorithm_config_overrides_per_module"):
        ma_config(algorithm_config_overrides_per_module={"odd": {"lr": 1e-3}}).validate()
    with pytest.raises(ValueError, match=r"FastDQN \(multi-agent\): `num_learners`=2: FastDQN's multi-agent "
                                         r"training runs on one learner"):
        (FastDQNConfig().environment(Countdown).learners(num_learners=2)
         .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, ep, **kw: "p")).validate()
    with pytest.raises(ValueError, match=r"is a MultiAgentEnv, but the config is single-agent"):
        FastPPOConfig().environment(Countdown).validate()

# Several DDP learners on multi-agent columns (rl_speed.learners.update_loop): the shards hold different numbers of
# each module's rows, so the learners agree on each module's minibatch count, cycle their own rows where they have
# fewer, and run a zero-weight placeholder for a module they have no rows of; the replicas stay identical.


def _weights(algo) -> list[dict]:
    """Every learner's weights of every module."""
    results = algo.learner_group.foreach_learner(
        lambda learner: {m: {k: v.detach().clone() for k, v in learner.module[m].unwrapped().state_dict().items()}
                         for m in learner.module.keys()})
    return [r.get() if hasattr(r, "get") else r for r in results]


def _identical(replicas: list[dict]) -> bool:
    first = replicas[0]
    return all(torch.equal(first[m][k], other[m][k]) for other in replicas[1:] for m in first for k in first[m])


def _changed(before: dict, after: dict, module: str) -> bool:
    return any(not torch.equal(before[module][k], after[module][k]) for k in before[module])


def test_two_learners_train_multi_agent_columns_and_stay_identical(ray_session):
    algo = ma_config().learners(num_learners=2, num_cpus_per_learner=0.5).build_algo()
    try:
        (start, _) = _weights(algo)
        for _ in range(2):
            result = algo.train()
        replicas = _weights(algo)
        assert _identical(replicas)  # DDP kept the replicas in lockstep
        assert _changed(start, replicas[0], "even") and _changed(start, replicas[0], "odd")
        for module in ("even", "odd"):
            assert np.isfinite(result["learners"][module]["policy_loss"])
            assert result["learners"][module]["num_module_steps_trained"] > 0
    finally:
        algo.stop()


def test_a_learner_without_a_modules_rows_takes_part_through_a_placeholder(ray_session):
    """Real sampled columns, split over two learners with the module column rewritten: the first shard's lanes are all
    "even", the second's one "even" lane and two "odd" ones. So the second learner has fewer "even" rows (it cycles
    them) and the first has no "odd" rows (it runs a placeholder). Both modules train, the replicas stay identical,
    and only real rows are counted and logged."""
    algo = ma_config().learners(num_learners=2, num_cpus_per_learner=0.5).build_algo()
    try:
        columns = algo.env_runner.sample_columns()
        first, second = split_lanes(columns, 2)
        order = ["even", "odd"]  # the module column's indices refer to the sorted module ids
        first[C.MODULE] = np.full_like(first[C.MODULE], order.index("even"))
        second[C.MODULE] = np.full_like(second[C.MODULE], order.index("odd"))
        second[C.MODULE][:, 0] = order.index("even")
        (start, _) = _weights(algo)
        results = algo.learner_group.update(batches=[first, second], minibatch_size=4, num_epochs=2,
                                            shuffle_batch_per_epoch=True, timesteps={})
        replicas = _weights(algo)
        assert _identical(replicas)
        assert _changed(start, replicas[0], "even") and _changed(start, replicas[0], "odd")
        def steps(result: dict, module: str) -> float:
            value = result.get(module, {}).get("num_module_steps_trained", 0)
            return value.peek() if hasattr(value, "peek") else value

        trained = {m: sum(steps(r, m) for r in results) for m in order}
        # what each learner logged: its own module's losses only (a placeholder logs nothing)
        assert [sorted(k for k in ("even", "odd") if "policy_loss" in r.get(k, {})) for r in results] == [
            ["even"], ["even", "odd"]]
        valid = {"even": int(first[C.VALID].sum() + second[C.VALID][:, 0].sum()),
                 "odd": int(second[C.VALID][:, 1:].sum())}
        assert int(first[C.VALID].sum()) > 2 * int(second[C.VALID][:, 0].sum())  # the "even" counts differ
        assert trained == {m: 2 * valid[m] for m in order}  # two epochs over each module's real rows only
    finally:
        algo.stop()


class TwoShapes(MultiAgentEnv):
    """Agent "small" sees [t] and picks 0/1; agent "big" sees [t, t, t] and picks 0/1/2; reward: the action taken.
    Episodes last 3 steps."""

    def __init__(self, config=None):
        super().__init__()
        self.agents = self.possible_agents = ["small", "big"]
        self.observation_spaces = {"small": gym.spaces.Box(0, 10, (1,), np.float32),
                                   "big": gym.spaces.Box(0, 10, (3,), np.float32)}
        self.action_spaces = {"small": gym.spaces.Discrete(2), "big": gym.spaces.Discrete(3)}
        self.t = 0

    def _obs(self):
        return {"small": np.full(1, self.t, np.float32), "big": np.full(3, self.t, np.float32)}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, actions):
        assert actions["small"] in (0, 1) and actions["big"] in (0, 1, 2)
        self.t += 1
        rewards = {aid: float(action) for aid, action in actions.items()}
        return self._obs(), rewards, {"__all__": self.t >= 3}, {"__all__": False}, {}


def _two_shapes_config():
    return (FastPPOConfig().environment(TwoShapes)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=8)
            .multi_agent(policies={"small", "big"}, policy_mapping_fn=lambda aid, episode, **kw: aid,
                         policies_to_train=["big"])
            .training(train_batch_size_per_learner=16, minibatch_size=8, num_epochs=1)
            .rl_module(model_config={"fcnet_hiddens": [8]}))


def test_agents_with_different_spaces_get_columns_per_module(ray_session):
    runner = MultiAgentBatchedEnvRunner(config=_two_shapes_config())
    try:
        cols = runner.sample_columns()
        C.check(cols)
        assert C.BY_MODULE in cols
        big, small = 0, 1  # indices into the sorted module ids; lane i * 2 + k is agent k of copy i
        obs_big, obs_small = cols[C.OBS]["big"], cols[C.OBS]["small"]
        assert obs_big.shape == (9, 4, 3) and obs_small.shape == (9, 4, 1)
        assert (cols[C.MODULE][:, [0, 2]] == small).all() and (cols[C.MODULE][:, [1, 3]] == big).all()
        steps = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0], np.float32)  # 3 steps + the reset step, twice, then obs[8]
        assert (obs_small[:, 0, 0] == steps).all() and (obs_big[:, 1] == steps[:, None]).all()
        assert not obs_big[:, [0, 2]].any() and not obs_small[:, [1, 3]].any()  # zeros where the other module acts
        assert cols[C.ACTION_DIST_INPUTS]["big"].shape == (8, 4, 3)
        assert cols[C.ACTION_DIST_INPUTS]["small"].shape == (8, 4, 2)
        valid = cols[C.VALID]  # each agent's reward is its own action, from its module's action column
        for lane, module in ((0, "small"), (1, "big")):
            taken = cols[C.ACTIONS][module][:, lane][valid[:, lane]]
            assert (cols[C.REWARDS][:, lane][valid[:, lane]] == taken).all()
    finally:
        runner.stop()


def test_fast_ppo_trains_agents_with_different_spaces(ray_session):
    algo = _two_shapes_config().build_algo()
    try:
        (before,) = _weights(algo)
        for _ in range(2):
            result = algo.train()
        (after,) = _weights(algo)
        assert _changed(before, after, "big") and not _changed(before, after, "small")  # policies_to_train
        assert np.isfinite(result["learners"]["big"]["policy_loss"])
    finally:
        algo.stop()


def test_fast_dqn_refuses_agents_with_different_spaces():
    config = (FastDQNConfig().environment(TwoShapes)
              .multi_agent(policies={"small", "big"}, policy_mapping_fn=lambda aid, episode, **kw: aid))
    with pytest.raises(ValueError, match=r"FastDQN: agents 'small' and 'big' have different observation spaces.*"
                                         r"FastPPO trains agents with different spaces"):
        config.validate()


def test_a_new_env_from_make_env_is_the_one_sampled_from_its_reset(ray_session):
    # RLlib's documented flow: change the runner's env_config, call make_env() (which closes the old env). The
    # columnar path then steps the new env's copies from their reset, not the closed ones where it left off.
    runner = MultiAgentBatchedEnvRunner(config=_turns_config(4))
    try:
        first = runner.sample_columns()[C.OBS]
        runner.sample_columns()
        runner.make_env()
        again = runner.sample_columns()[C.OBS]
        assert runner._envs == [env.unwrapped for env in runner.env.envs]
        np.testing.assert_array_equal(again, first)
    finally:
        runner.stop()


def test_the_columnar_path_seeds_the_first_reset_of_each_env_the_runner_makes(ray_session, monkeypatch):
    seeds = []
    reset = TakeTurns.reset
    monkeypatch.setattr(TakeTurns, "reset", lambda self, *, seed=None, options=None: (
        seeds.append(seed), reset(self, seed=seed, options=options))[1])
    runner = MultiAgentBatchedEnvRunner(config=_turns_config(8).debugging(seed=3))
    try:
        for _ in range(2):  # the runner's first env, then a new one from make_env() (RLlib's checker resets it too)
            seeds.clear()
            runner.sample_columns()  # episodes end within 8 steps: the later resets are the episodes' own
            assert seeds[0] == 3 and seeds[1:] and all(s is None for s in seeds[1:]), seeds
            runner.make_env()
    finally:
        runner.stop()
