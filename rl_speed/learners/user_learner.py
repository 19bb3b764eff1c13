"""A user's RLlib Learner subclass on the columnar path.

RLlib's extension point for a custom loss or custom optimizers is a subclass of the algorithm's learner
(``config.training(learner_class=MyPPOLearner)`` with ``MyPPOLearner(PPOTorchLearner)`` overriding
``compute_loss_for_module``, ``configure_optimizers_for_module``, ``build``, ...). Such a class cannot replace
FastPPO's learner (it would expect episodes), so the learner FastPPO / FastDQN build is the user's class stacked on
the columnar one: ``class MyPPOLearnerOnColumns(MyPPOLearner, FastPPOTorchLearner)``. Python's method order then
runs the user's overrides first, and their ``super()`` calls reach rl_speed's columnar learner and, below it, RLlib's
(``MyPPOLearner -> FastPPOTorchLearner -> its mixins -> PPOTorchLearner``). The batch a user's loss sees has RLlib's
PPO / DQN keys (``Columns.OBS``, ``ACTIONS``, ``ACTION_LOGP``, ``Postprocessing.ADVANTAGES``, ...), as on stock.
"""

from __future__ import annotations

_STACKED: dict[tuple[type, type], type] = {}


def rllib_base(columnar: type) -> type:
    """The RLlib learner class the columnar learner extends (e.g. ``PPOTorchLearner`` for FastPPO's)."""
    return next(cls for cls in columnar.__mro__[1:] if cls.__module__.startswith("ray.rllib.algorithms."))


def stack_on_columns(user: type, columnar: type) -> type:
    """``user`` if it already extends ``columnar``; else the user's class over the columnar learner (one class per
    pair, so every call and every learner actor gets the same one). ``user`` must extend ``rllib_base(columnar)``."""
    if issubclass(user, columnar):
        return user
    key = (user, columnar)
    if key not in _STACKED:
        _STACKED[key] = type(f"{user.__name__}OnColumns", (user, columnar),
                             {"__module__": user.__module__, "__doc__": user.__doc__})
    return _STACKED[key]
