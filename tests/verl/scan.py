"""Run in a subprocess: import verl's engine and rollout modules, print (JSON) what of verl is not verl's own.

``python -m tests.verl.scan [--import-patches]``: every function and class attribute of every loaded
``verl`` module whose object comes from patchreg, ``patches`` or wrapt, the default registry's active
installs, and which ``patch_engine_mtp`` / ``build_mtp_speculative_config`` verl's call sites see.
"""

from __future__ import annotations

import json
import sys
from typing import Any

FOREIGN = ("patches", "patchreg", "wrapt", "_wrappers")  # wrapt's compiled proxies live in `_wrappers`


def _foreign(value: Any) -> bool:
    inner = getattr(value, "__func__", value)  # staticmethod / classmethod
    kinds = (type(inner).__module__ or "", getattr(inner, "__module__", None) or "")
    proxied = any(c.__name__ == "ObjectProxy" for c in type(inner).__mro__)  # a wrap, whatever it wraps
    return proxied or any(k.split(".")[0] in FOREIGN for k in kinds)


def scan() -> list[str]:
    """``module.name`` (or ``module.Class.attr``) of every verl attribute that is not verl's or its libraries'."""
    found = []
    for mod_name, module in sorted(sys.modules.items()):
        if module is None or not (mod_name == "verl" or mod_name.startswith("verl.")):
            continue
        for name, value in list(vars(module).items()):
            if _foreign(value):
                found.append(f"{mod_name}.{name}")
            if isinstance(value, type) and (value.__module__ or "").startswith("verl"):
                found += [f"{mod_name}.{name}.{a}" for a, v in list(vars(value).items()) if _foreign(v)]
    return found


def main() -> None:
    """Import what the opt-in patches, then report."""
    if "--import-patches" in sys.argv:
        import patches.verl  # noqa: F401  (what an installed patchreg offers; imported without the opt-in)
    import verl  # noqa: F401
    import verl.workers.engine.megatron.transformer_impl as impl
    import verl.workers.rollout.vllm_rollout.vllm_async_server as server

    import patchreg

    out = {
        "foreign": sorted(set(scan())),
        "active": sorted(f"{e.patch} {e.state}" for e in patchreg.registry.active()),
        "engine_fn": impl.patch_engine_mtp.__module__,
        "server_fn": server.build_mtp_speculative_config.__module__,
        "patches_verl_imported": "patches.verl" in sys.modules,
    }
    sys.stdout.write("SCAN " + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
