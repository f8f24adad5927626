"""How many repetitions each section runs: the full run and ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """Repetitions and block sizes; ``fast()`` (``--quick``) keeps the whole run within about a minute."""

    quick: bool = False
    repeat: int = 51
    cold_repeat: int = 51
    scale_ops: int = 2048
    call_ops: int = 20000
    warm_ops: int = 20000
    cycle_ops: int = 300
    steps: int = 400
    after_steps: int = 101
    rss_steps: int = 30
    hygiene_models: int = 100
    first_use_runs: int = 5

    @classmethod
    def full(cls) -> Settings:
        return cls()

    @classmethod
    def fast(cls) -> Settings:
        return cls(
            quick=True,
            repeat=5,
            cold_repeat=5,
            scale_ops=256,
            call_ops=2000,
            warm_ops=2000,
            cycle_ops=50,
            steps=3,
            after_steps=3,
            rss_steps=2,
            hygiene_models=10,
            first_use_runs=1,
        )
