"""rl_speed: fast reinforcement learning on Ray RLlib's new API stack.

Importing this package does nothing heavy; call :func:`register` once (it is idempotent) to make rl_speed's
environments and algorithms known to Ray Tune, RLlib and gymnasium.
"""

__version__ = "0.1.0"


def register() -> None:
    """Registers every rl_speed environment and algorithm with Ray Tune and gymnasium (idempotent)."""
    from rl_speed.registry import register as _register

    _register()


__all__ = ["register", "__version__"]
