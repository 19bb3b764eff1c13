"""The columnar forms of RLlib's env-to-module pieces give the module the same inputs as RLlib's own pipeline on the
same observation stream (episodes starting and ending at various steps), and keep RLlib's piece state."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import tree

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.env_to_module import FlattenObservations, MeanStdFilter, PrevActionsPrevRewards
from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
from ray.rllib.core.columns import Columns
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rl_speed.connectors.env_to_module import Step, UnsupportedConnector, apply, columnar_pipeline

N, T = 5, 40
BOX = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
DICT = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "code": gym.spaces.Discrete(3),
                        "pair": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0, 5, (1,), np.float32)])})
IMAGE = gym.spaces.Box(0, 255, (10, 10, 1), np.uint8)  # RLlib has a default CNN for 10 x 10
ACTIONS = gym.spaces.Discrete(4)
CARTPOLE = gym.spaces.Box(-5.0, 5.0, (4,), np.float32)


def _reduce_cartpole():
    """RLlib's own SingleAgentObservationPreprocessor example (connectors/single_agent_observation_preprocessor.py)."""
    from ray.rllib.examples.connectors.single_agent_observation_preprocessor import (
        ReduceCartPoleObservationsToNonMarkovian,
    )

    return ReduceCartPoleObservationsToNonMarkovian()


def _stream(space: gym.Space, seed: int = 0) -> list[tuple]:
    """(obs [N, ...], actions [N], rewards [N], is_first [N]) per step; lanes start new episodes at random steps."""
    rng = np.random.default_rng(seed)
    space.seed(seed)
    steps = []
    for t in range(T):
        obs = [space.sample() for _ in range(N)]
        if space is BOX:  # lopsided, as in RLlib's mean_std_filtering example: large offset and scale
            obs = [o * 50.0 + 1000.0 for o in obs]
        batch = tree.map_structure(lambda *xs: np.stack(xs), *obs)
        first = np.ones(N, bool) if t == 0 else rng.random(N) < 0.15
        steps.append((batch, rng.integers(0, 4, N), rng.normal(size=N).astype(np.float32), first))
    return steps


def _pipeline(make_pieces, space: gym.Space):
    config = PPOConfig().env_runners(env_to_module_connector=lambda env, spaces, device: make_pieces())
    return config.build_env_to_module_connector(spaces={INPUT_ENV_SINGLE_SPACES: (space, ACTIONS)})


def _rllib_inputs(make_pieces, space: gym.Space, stream: list) -> tuple[list, object]:
    """Module inputs from RLlib's own pipeline, driven with one episode per lane as its env runner does."""
    pipeline = _pipeline(make_pieces, space)
    module = PPOConfig().get_default_rl_module_spec()
    module.observation_space, module.action_space = pipeline.observation_space, ACTIONS
    module = module.build()
    episodes: list = [None] * N
    inputs = []
    for obs, actions, rewards, first in stream:
        for i in range(N):
            lane = tree.map_structure(lambda o: o[i], obs)
            if first[i]:
                episodes[i] = SingleAgentEpisode(observation_space=space, action_space=ACTIONS)
                episodes[i].add_env_reset(observation=lane)
            else:
                episodes[i].add_env_step(observation=lane, action=actions[i], reward=rewards[i])
        batch = pipeline(rl_module=module, batch={}, episodes=episodes, explore=True, shared_data={})
        inputs.append(tree.map_structure(lambda x: x.numpy(), batch[Columns.OBS]))
    return inputs, pipeline


def _columnar_inputs(make_pieces, space: gym.Space, stream: list) -> tuple[list, object]:
    pipeline = _pipeline(make_pieces, space)
    forms = columnar_pipeline(pipeline, N)
    inputs = []
    for t, (obs, actions, rewards, first) in enumerate(stream):
        step = Step(first) if t == 0 else Step(first, stream[t - 1][1], stream[t - 1][2])
        inputs.append(apply(forms, obs, step))
    return inputs, pipeline


CASES = {
    "mean_std_filter": (lambda: MeanStdFilter(), BOX),
    "mean_std_filter_clip_no_std": (lambda: MeanStdFilter(de_std_to_one=False, clip_by_value=3.0), BOX),
    "flatten_dict_tuple": (lambda: FlattenObservations(), DICT),
    "flatten_removing_a_key": (lambda: FlattenObservations(input_observation_space=DICT, input_action_space=ACTIONS,
                                                           keys_to_remove=["code"]), DICT),
    "prev_actions_prev_rewards_flattened": (
        lambda: [PrevActionsPrevRewards(n_prev_actions=2, n_prev_rewards=3), FlattenObservations()], BOX),
    "mean_std_then_prev_actions": (lambda: [MeanStdFilter(), PrevActionsPrevRewards(), FlattenObservations()], BOX),
    "frame_stacking": (lambda: FrameStackingEnvToModule(num_frames=4), IMAGE),
    "user_observation_preprocessor": (_reduce_cartpole, CARTPOLE),
    "user_preprocessor_then_mean_std": (lambda: [_reduce_cartpole(), MeanStdFilter()], CARTPOLE),
}


@pytest.mark.parametrize("case", list(CASES))
def test_columnar_form_gives_the_module_rllibs_inputs(case):
    make_pieces, space = CASES[case]
    stream = _stream(space)
    # Actions and rewards in the stream are those of the step that led to the observation: the step before.
    expected, rllib_pipeline = _rllib_inputs(make_pieces, space, [
        (obs, stream[t - 1][1] if t else None, stream[t - 1][2] if t else None, first)
        for t, (obs, _, _, first) in enumerate(stream)])
    got, columnar_pipeline_ = _columnar_inputs(make_pieces, space, stream)
    for t, (e, g) in enumerate(zip(expected, got)):
        e_leaves, g_leaves = tree.flatten(e), tree.flatten(g)
        assert len(e_leaves) == len(g_leaves), (t, e, g)
        for el, gl in zip(e_leaves, g_leaves):
            np.testing.assert_allclose(np.asarray(gl, np.float64), np.asarray(el, np.float64), rtol=1e-5,
                                       atol=1e-5, err_msg=f"step {t}")
    # Stateful pieces end in the same state (what checkpoints and the cross-runner merge read).
    for ours, theirs in zip(columnar_pipeline_.connectors, rllib_pipeline.connectors):
        if isinstance(ours, MeanStdFilter):
            for a, b in zip(tree.flatten(ours.get_state()), tree.flatten(theirs.get_state())):
                if isinstance(a, (int, float, np.ndarray)):
                    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6)


def test_frozen_filter_does_not_update_its_statistics():
    stream = _stream(BOX)
    pipeline = _pipeline(lambda: MeanStdFilter(update_stats=False), BOX)
    forms = columnar_pipeline(pipeline, N)
    before = pipeline.connectors[0].get_state()
    apply(forms, stream[0][0], Step(stream[0][3]))
    assert pipeline.connectors[0].get_state()[None]["running_stats"][0]["num_pushes"] == \
        before[None]["running_stats"][0]["num_pushes"] == 0


def _protobuf_stream() -> tuple[gym.Space, list]:
    """Observations of RLlib's protobuf-encoded CartPole (examples/envs/env_w_protobuf_observations.py), N envs
    stepped with random actions, each reset when its episode ends."""
    from ray.rllib.examples.envs.classes.cartpole_with_protobuf_observation_space import (
        CartPoleWithProtobufObservationSpace,
    )

    envs = [CartPoleWithProtobufObservationSpace() for _ in range(N)]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    first, stream, rng = np.ones(N, bool), [], np.random.default_rng(0)
    for _ in range(T):
        stream.append((np.stack(obs), rng.integers(0, 2, N), np.ones(N, np.float32), first.copy()))
        for i, env in enumerate(envs):
            if first[i] and len(stream) > 1:
                first[i] = False
            o, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            if terminated or truncated:
                o, _ = env.reset()
                first[i] = True
            obs[i] = o
    return envs[0].observation_space, stream


def test_a_raw_piece_that_rewrites_the_last_observation_gives_rllibs_inputs():
    from ray.rllib.examples.connectors.classes.protobuf_cartpole_observation_decoder import (
        ProtobufCartPoleObservationDecoder,
    )

    space, stream = _protobuf_stream()
    expected, _ = _rllib_inputs(lambda: ProtobufCartPoleObservationDecoder(), space, stream)
    got, pipeline = _columnar_inputs(lambda: ProtobufCartPoleObservationDecoder(), space, stream)
    for t, (want, have) in enumerate(zip(expected, got)):
        np.testing.assert_array_equal(have, want, err_msg=f"step {t}")


class _ReadsHistory(__import__("ray.rllib.connectors.connector_v2", fromlist=["ConnectorV2"]).ConnectorV2):
    """Adds the previous observation: needs history the columnar path does not keep."""

    def __call__(self, *, rl_module, batch, episodes, explore=None, shared_data=None, **kwargs):
        for episode in self.single_agent_episode_iterator(episodes):
            episode.set_observations(new_data=episode.get_observations(-1) - episode.get_observations(-2),
                                     at_indices=-1)
        return batch


@pytest.mark.parametrize("make_piece, message", [
    (lambda: _ReadsHistory(), r"_ReadsHistory calls `episode.get_observations\(-2"),
    (lambda: __import__("ray.rllib.connectors.env_to_module", fromlist=["x"]).WriteObservationsToEpisodes(),
     r"WriteObservationsToEpisodes.*failed on the env's first observation"),
])
def test_a_raw_piece_that_needs_more_than_the_last_observation_is_refused_at_config_time(make_piece, message):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = FastPPOConfig().environment("CartPole-v1").env_runners(
        env_to_module_connector=lambda env, spaces, device: make_piece())
    with pytest.raises(ValueError, match=r"FastPPO: `env_to_module_connector`: .*" + message):
        config.validate()


def test_a_user_preprocessor_with_preprocess_batch_gets_all_lanes_at_once():
    from ray.rllib.connectors.env_to_module.observation_preprocessor import SingleAgentObservationPreprocessor

    calls = []

    class Doubled(SingleAgentObservationPreprocessor):
        def recompute_output_observation_space(self, input_observation_space, input_action_space):
            return input_observation_space

        def preprocess(self, observation, episode):
            return observation * 2.0

        def preprocess_batch(self, observations):
            calls.append(observations.shape)
            return observations * 2.0

    stream = _stream(BOX)
    forms = columnar_pipeline(_pipeline(lambda: Doubled(), BOX), N)
    np.testing.assert_allclose(apply(forms, stream[0][0], Step(stream[0][3])), stream[0][0] * 2.0)
    assert calls == [(N, 3)]


def test_a_user_preprocessor_that_reads_the_episode_is_refused_with_the_way_out():
    from ray.rllib.connectors.env_to_module.observation_preprocessor import SingleAgentObservationPreprocessor

    class ByAgent(SingleAgentObservationPreprocessor):
        def recompute_output_observation_space(self, input_observation_space, input_action_space):
            return input_observation_space

        def preprocess(self, observation, episode):
            return observation if episode.agent_id is None else -observation

    with pytest.raises(UnsupportedConnector, match="ByAgent.preprocess.*episode=None.*preprocess_batch"):
        columnar_pipeline(_pipeline(lambda: ByAgent(), BOX), N)


def test_the_single_agent_observation_preprocessor_example_trains(ray_session):
    """examples/connectors/single_agent_observation_preprocessor.py's piece on FastPPO (an MLP here, for speed; the
    script's LSTM is RLlib's use_lstm, tested elsewhere): the module sees 2 of CartPole's 4 numbers."""
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4,
                           env_to_module_connector=lambda env, spaces, device: _reduce_cartpole())
              .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1))
    algo = config.build_algo()
    try:
        algo.train()
        columns = algo.env_runner.sample_columns()
        assert columns["obs"].shape[-1] == 2
    finally:
        algo.stop()


# Multi-agent pipelines: the per-copy forms (rl_speed.connectors.env_to_module.multi_agent_pipeline) against RLlib's own
# pipeline on a MultiAgentEpisode, over RLlib's example of a MultiAgentObservationPreprocessor (agents end up with
# different spaces: one flattened, one not).


def _double_row_corridor_config(pieces, config_class=PPOConfig):
    from ray.rllib.examples.envs.classes.multi_agent.double_row_corridor_env import DoubleRowCorridorEnv

    return (config_class().environment(DoubleRowCorridorEnv)
            .env_runners(env_to_module_connector=lambda env, spaces, device: pieces())
            .multi_agent(policies={"p0", "p1"},
                         policy_mapping_fn=lambda aid, episode, **kw: "p0" if aid == "agent_0" else "p1"))


def _corridor_pieces():
    from ray.rllib.examples.connectors.classes.add_other_agents_row_index_to_xy_pos import (
        AddOtherAgentsRowIndexToXYPos,
    )

    return [AddOtherAgentsRowIndexToXYPos(), FlattenObservations(multi_agent=True, agent_ids=["agent_0"])]


def test_multi_agent_forms_give_the_modules_rllibs_inputs():
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    from ray.rllib.examples.envs.classes.multi_agent.double_row_corridor_env import DoubleRowCorridorEnv

    from rl_speed.connectors.env_to_module import apply_per_copy, multi_agent_pipeline

    config = _double_row_corridor_config(_corridor_pieces)
    env = DoubleRowCorridorEnv()
    agents = env.possible_agents
    spaces = tuple(gym.spaces.Dict({aid: get(aid) for aid in agents})
                   for get in (env.get_observation_space, env.get_action_space))
    pipeline = config.build_env_to_module_connector(spaces={INPUT_ENV_SINGLE_SPACES: spaces})
    out = pipeline.connectors[1].observation_space  # per agent, after the user's pieces
    module = config.get_multi_rl_module_spec(spaces={"p0": (out["agent_0"], spaces[1]["agent_0"]),
                                                     "p1": (out["agent_1"], spaces[1]["agent_1"])}).build()
    forms = multi_agent_pipeline(config.build_env_to_module_connector(spaces={INPUT_ENV_SINGLE_SPACES: spaces}))
    rng = np.random.default_rng(0)
    obs, episode, compared = None, None, 0
    for step in range(60):
        if episode is None or episode.is_done:
            obs, _ = env.reset(seed=step)
            episode = MultiAgentEpisode(observation_space=spaces[0], action_space=spaces[1],
                                        agent_to_module_mapping_fn=config.policy_mapping_fn)
            episode.add_env_reset(observations=obs)
        else:
            actions = {aid: int(rng.integers(4)) for aid in obs}
            obs, rewards, terminateds, truncateds, _ = env.step(actions)
            episode.add_env_step(observations=obs, actions=actions, rewards=rewards, terminateds=terminateds,
                                 truncateds=truncateds)
            if episode.is_done:
                continue
        raw = {aid: np.array(o) for aid, o in obs.items()}
        rllib = pipeline(rl_module=module, batch={}, episodes=[episode], explore=True, shared_data={})
        ours = apply_per_copy(forms, raw)
        for aid, mid in (("agent_0", "p0"), ("agent_1", "p1")):
            if aid in ours:
                np.testing.assert_array_equal(ours[aid], rllib[mid][Columns.OBS].numpy()[0])
                compared += 1
    assert compared > 60


def test_a_multi_agent_piece_without_a_form_is_refused_at_config_time_by_name():
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = _double_row_corridor_config(lambda: MeanStdFilter(multi_agent=True), FastPPOConfig)
    with pytest.raises(ValueError, match=r"env_to_module_connector.*MeanStdFilter has no columnar form"):
        config.validate()


def test_the_multi_agent_observation_preprocessor_example_trains(ray_session):
    """RLlib's connectors/multi_agent_observation_preprocessor.py configuration (its pieces, env, modules), 2
    iterations: the two modules see different spaces after the pieces."""
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = _double_row_corridor_config(_corridor_pieces, FastPPOConfig)
    algo = (config.env_runners(num_env_runners=0, num_envs_per_env_runner=4)
            .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1).build_algo())
    try:
        for _ in range(2):
            result = algo.train()
        assert np.isfinite(result["learners"]["p0"]["policy_loss"])
        assert np.isfinite(result["learners"]["p1"]["policy_loss"])
    finally:
        algo.stop()
