"""Calling Megatron-Core across releases: arguments built from the installed signatures.

Every upstream call the patches make goes through :func:`call` (or an :class:`Adapter`), which
reads the callee's signature once per function object (cached), passes the arguments it
accepts, and raises :class:`MissingUpstreamArgumentError` for a required parameter the patch
cannot supply. The per-call work is a dict comprehension over the accepted names: training
steps call these on every forward.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import patchreg
from patches.megatron.errors import MissingUpstreamArgumentError

__all__ = [
    "GPT",
    "MTP",
    "RANDOM",
    "Adapter",
    "Binder",
    "absent",
    "adapter",
    "binder",
    "call",
    "call_kwargs",
    "form",
    "mcore_version",
    "module",
    "parameters",
    "per_function",
    "refusal",
    "unmet",
    "upstream",
]

#: Import paths of the upstream modules the patches touch.
GPT = "megatron.core.models.gpt.gpt_model"
MTP = "megatron.core.transformer.multi_token_prediction"
RANDOM = "megatron.core.tensor_parallel.random"

_PARAMS: dict[Any, tuple[dict[str, inspect.Parameter], bool]] = {}
_ADAPTERS: dict[Any, Adapter] = {}
_BINDERS: dict[Any, Binder] = {}
_FUNCTION = types.FunctionType
_T = TypeVar("_T")


def absent(*modules: str) -> str:
    """Why a probe cannot run here: ``"torch is not installed"`` for the first of ``modules`` (import names) that
    cannot be found, else ``""``. Found without importing: a shipped predicate answers no for a missing optional
    package, with this reason, instead of raising ``ModuleNotFoundError``."""
    for name in modules:
        try:
            found = name in sys.modules or importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            found = False
        if not found:
            return f"{_DISTRIBUTIONS.get(name, name)} is not installed (no module named {name!r})"
    return ""


#: The distributions of the import names a probe needs, for its reason.
_DISTRIBUTIONS = {"megatron.core": "megatron-core", "megatron.bridge": "megatron-bridge", "torch": "torch"}


def mcore_version() -> str:
    """The version of the megatron-core code Python imports (``patchreg.provider``: its metadata, or the tree's own
    version where there is none or it belongs to other files), or ``"not installed"``."""
    return patchreg.provider("megatron-core").version_or("not installed")


def module(name: str) -> Any:
    """The upstream module ``name``, imported on first use (then a ``sys.modules`` lookup)."""
    found = sys.modules.get(name)  # the import system's own first step, without its call overhead
    return found if found is not None else importlib.import_module(name)


def upstream(module_name: str, qualname: str) -> Any:
    """The attribute ``qualname`` of the upstream module, or None when it does not exist."""
    obj: Any = module(module_name)
    if "." not in qualname:
        return getattr(obj, qualname, None)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _unwrap(func: Any) -> Any:
    """The plain function under bound methods, wrapt proxies and static/class methods."""
    func = getattr(func, "__func__", func)
    return getattr(func, "__wrapped__", func)


def cache_key(func: Any) -> Any:
    """The cache key of ``func``: itself when a plain function (stable, no attribute probing), else what it wraps.

    Bound methods and wrapt proxies are made afresh on each attribute access and would keep their
    instance alive in the cache, so they are keyed by the function under them.
    """
    return func if type(func) is _FUNCTION else _unwrap(func)


def per_function(cache: dict[Any, _T], make: Callable[[Any], _T], func: Any) -> _T:
    """``make(func)``, made once per function object (bound methods share their function's) and kept in ``cache``."""
    key = cache_key(func)
    found = cache.get(key)
    if found is None:
        found = cache[key] = make(func)
    return found


def parameters(func: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    """The named parameters of ``func`` (without ``self``) and whether it takes ``**kwargs``; cached."""
    return per_function(_PARAMS, _read_parameters, func)


def _read_parameters(func: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    sig = inspect.signature(func)
    named = {n: p for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"}
    return named, any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


class Adapter:
    """What one callee accepts, read once: :meth:`kwargs` picks those names out of what a patch has."""

    __slots__ = ("names", "required", "takes_kwargs", "where")

    def __init__(self, func: Callable[..., Any]) -> None:
        named, self.takes_kwargs = parameters(func)
        self.where = _where(func)  # a name, not the callee: a bound method would keep its instance alive
        self.names = tuple(named)
        self.required = tuple(n for n, p in named.items() if p.default is p.empty)

    def kwargs(self, available: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Keyword arguments: what the callee accepts from ``available``, plus all of ``extra``."""
        kwargs = {name: available[name] for name in self.names if name in available}
        for name in self.required:
            if name not in kwargs:
                raise _missing(self.where, name)
        if extra:
            kwargs.update(extra)
        return kwargs


def adapter(func: Callable[..., Any]) -> Adapter:
    """The :class:`Adapter` of ``func``, cached per function object (bound methods share their function's)."""
    return per_function(_ADAPTERS, Adapter, func)


def call_kwargs(
    func: Callable[..., Any], available: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``func``: what it accepts from ``available``, plus all of ``extra``.

    A required parameter missing from ``available`` raises :class:`MissingUpstreamArgumentError`.
    """
    return adapter(func).kwargs(available, extra)


def call(func: Callable[..., Any], available: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Any:
    """Call ``func`` with :func:`call_kwargs`."""
    return func(**adapter(func).kwargs(available, extra))


class Binder:
    """``inspect.Signature.bind`` + ``apply_defaults`` of one method, with fast paths for plain calls.

    A call passing every parameter by keyword (what ``GPTModel.forward`` does) is returned as
    it came; one whose arguments otherwise fit the signature (positional ones in order, known
    keywords, every required name given) is bound without ``inspect``; anything else goes
    through the signature, which binds it or raises the ``TypeError`` Python would.
    """

    __slots__ = ("allowed", "defaults", "positional", "required", "signature", "simple")

    def __init__(self, func: Callable[..., Any]) -> None:
        self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())[1:]  # without self
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self.simple = all(p.kind in kinds for p in params)
        self.positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.allowed = frozenset(p.name for p in params)
        self.required = tuple(p.name for p in params if p.default is p.empty)
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def bind(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name (without ``self``), defaults filled in; do not mutate the result."""
        if self.simple:
            if not args and kwargs.keys() == self.allowed:
                return kwargs
            if len(args) <= len(self.positional) and self.allowed.issuperset(kwargs):
                given = dict(zip(self.positional, args, strict=False))
                if given.keys().isdisjoint(kwargs):
                    given.update(kwargs)
                    if all(name in given for name in self.required):
                        return {**self.defaults, **given}
        bound = self.signature.bind(obj, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(self.signature.parameters)), None)
        return arguments


def binder(func: Callable[..., Any]) -> Binder:
    """The :class:`Binder` of ``func`` (an unbound method), cached per function object."""
    return per_function(_BINDERS, Binder, func)


def _where(func: Callable[..., Any]) -> str:
    return str(getattr(_unwrap(func), "__qualname__", repr(func)))


#: What to do when the installed upstream has a form the patches cannot call.
REMEDY = (
    "pin a supported megatron-core (0.13.1-0.19.2, or a Megatron-LM main or dev tree of August 2026: main d98e8a64dd, "
    "dev d48bd6be0a) or report this release so the MTP patch set learns the new form"
)


def _missing(where: str, name: str) -> MissingUpstreamArgumentError:
    msg = (
        f"{where} in megatron-core {mcore_version()} requires the argument {name!r}, which patches.megatron "
        f"cannot supply on this release; {REMEDY}."
    )
    return MissingUpstreamArgumentError(msg, target=where)


def unmet(func: Callable[..., Any], supplied: Collection[str]) -> str | None:
    """Why the patches cannot call ``func`` with arguments named ``supplied`` (its required parameters they do not
    supply), or None when they can: what :func:`call_kwargs` would raise at the call, said before it."""
    missing = [name for name in adapter(func).required if name not in supplied]
    if not missing:
        return None
    return f"{form(func)} requires {', '.join(map(repr, missing))}, which the patches do not pass"


def form(func: Callable[..., Any]) -> str:
    """``func`` as its module, name and parameter names: ``megatron.core...roll_tensor(tensors, shifts, ...)``."""
    names = ", ".join(inspect.signature(func).parameters)
    return f"{getattr(_unwrap(func), '__module__', '?')}.{_where(func)}({names})"


def refusal(unmet: Sequence[str], route: str) -> MissingUpstreamArgumentError:
    """The error that refuses a block at its entry: the release, each upstream function the route (``route``) calls
    in a form the patches cannot call, and the remedy. Nothing is installed."""
    msg = (
        f"mtp_patched cannot run {route} on megatron-core {mcore_version()}: {'; '.join(unmet)}. Nothing was "
        f"installed, and no forward ran; {REMEDY}."
    )
    return MissingUpstreamArgumentError(msg, target=unmet[0].split("(")[0])
