"""Calling Megatron-Core across releases: arguments built from the installed signatures.

Every upstream call the patches make goes through :func:`call`, which reads the callee's
signature once (cached), passes the arguments it accepts, and raises
:class:`MissingUpstreamArgumentError` for a required parameter the patch cannot supply.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from patches.megatron.errors import MissingUpstreamArgumentError

__all__ = [
    "GPT",
    "MTP",
    "RANDOM",
    "call",
    "call_kwargs",
    "mcore_version",
    "parameters",
    "upstream",
]

#: Import paths of the upstream modules the patches touch.
GPT = "megatron.core.models.gpt.gpt_model"
MTP = "megatron.core.transformer.multi_token_prediction"
RANDOM = "megatron.core.tensor_parallel.random"

_PARAMS: dict[Any, tuple[dict[str, inspect.Parameter], bool]] = {}


def mcore_version() -> str:
    """The installed megatron-core version, or ``"not installed"``."""
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def upstream(module: str, qualname: str) -> Any:
    """The attribute ``qualname`` of the upstream module, or None when it does not exist."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _unwrap(func: Any) -> Any:
    """The plain function under bound methods, wrapt proxies and static/class methods."""
    func = getattr(func, "__func__", func)
    return getattr(func, "__wrapped__", func)


def parameters(func: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    """The named parameters of ``func`` (without ``self``) and whether it takes ``**kwargs``; cached."""
    key = _unwrap(func)
    found = _PARAMS.get(key)
    if found is None:
        sig = inspect.signature(func)
        named = {
            n: p for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"
        }
        found = (named, any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()))
        _PARAMS[key] = found
    return found


def call_kwargs(
    func: Callable[..., Any], available: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``func``: what it accepts from ``available``, plus all of ``extra``.

    A required parameter missing from ``available`` raises :class:`MissingUpstreamArgumentError`.
    """
    named, _takes_kwargs = parameters(func)
    kwargs = {}
    for name, param in named.items():
        if name in available:
            kwargs[name] = available[name]
        elif param.default is param.empty:
            raise _missing(func, name)
    kwargs.update(extra or {})
    return kwargs


def call(func: Callable[..., Any], available: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Any:
    """Call ``func`` with :func:`call_kwargs`."""
    return func(**call_kwargs(func, available, extra))


def _missing(func: Callable[..., Any], name: str) -> MissingUpstreamArgumentError:
    where = getattr(_unwrap(func), "__qualname__", repr(func))
    msg = (
        f"{where} in megatron-core {mcore_version()} requires the argument {name!r}, which patches.megatron "
        "cannot supply on this release; pin a supported megatron-core (0.13.1-0.19.2) or report this release "
        "so the MTP patch set learns the new argument."
    )
    return MissingUpstreamArgumentError(msg, target=where)
