"""verl 0.9 patch set (opt-in): ``VERL_MTP`` routes verl's MTP hooks through patchreg.

Turn it on in one of two ways (installing patchreg alone changes nothing in verl):

- ``VERL_USE_EXTERNAL_MODULES=patches.verl``: verl's ``__init__`` imports this package in every
  process (Ray workers too, when the variable is in the job's ``runtime_env`` ``env_vars``), and this
  package then applies ``VERL_MTP`` lazily to the default registry. Importing it without that variable
  naming it applies nothing.
- ``patchreg.apply(patches.verl.VERL_MTP, lazy=True)`` in your own entry point, before verl's engine or
  rollout modules are imported (``lazy=True`` also installs at once what is imported already).
"""

from __future__ import annotations

import os

import patchreg
from patches.verl.engine import EngineMTP, engine_report, engine_reports, patch_engine_mtp
from patches.verl.mtp import VERL_MTP
from patches.verl.rollout import build_mtp_speculative_config

__all__ = [
    "ENV_VAR",
    "VERL_MTP",
    "EngineMTP",
    "build_mtp_speculative_config",
    "engine_report",
    "engine_reports",
    "opted_in",
    "patch_engine_mtp",
]

#: verl's variable naming the modules it imports at ``import verl``.
ENV_VAR = "VERL_USE_EXTERNAL_MODULES"


def opted_in(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether ``VERL_USE_EXTERNAL_MODULES`` names this package (verl splits it on commas)."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return __name__ in (name.strip() for name in value.split(","))


#: The lazy apply made at import when :func:`opted_in` (None otherwise).
REPORT: patchreg.Report | None = patchreg.apply(VERL_MTP, lazy=True) if opted_in() else None
