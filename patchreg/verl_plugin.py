"""verl's plugin: verl 0.9 imports this module when it is imported (the ``verl.plugins`` entry point ``patchreg``).

Importing it runs :func:`patchreg.bootstrap`: the sets named in ``PATCHREG_PATCHSETS`` are applied in
every process that imports verl (its driver and each Ray worker). verl swallows a plugin's error at
debug level, so a failure is logged here as an error first, then raised.
"""

from __future__ import annotations

import logging

from patchreg._bootstrap import bootstrap

__all__: list[str] = []

try:
    bootstrap()
except Exception as exc:
    logging.getLogger("patchreg").error("patchreg: the verl plugin's bootstrap() failed: %s", exc)
    raise
