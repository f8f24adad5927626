"""Which Megatron-Core models ``mtp_patched`` handles, found through wrappers and in chunk lists.

Two families, each with its own patch set: ``GPTModel`` (MTP in ``_postprocess``, 0.13+) and the
hybrid family, ``HybridModel`` (0.18+; ``MambaModel`` is a subclass there) and ``MambaModel`` 0.17
(MTP and loss inline in ``forward``). A model class is only looked for when its module is already
imported: an instance of it implies its module was, so finding costs no import. Anything else is
refused, naming the innermost model found through the wrappers and what to do.
"""

from __future__ import annotations

import sys
from typing import Any

from patches.megatron._compat import GPT, mcore_version
from patches.megatron.errors import UnsupportedModelError

__all__ = ["GPT_FAMILY", "HYBRID", "HYBRID_FAMILY", "MAMBA", "language_models", "model_family"]

HYBRID = "megatron.core.models.hybrid.hybrid_model"
MAMBA = "megatron.core.models.mamba.mamba_model"
GPT_FAMILY, HYBRID_FAMILY = "gpt", "hybrid"

#: (module, class name, family), most specific first.
_CANDIDATES = (
    (GPT, "GPTModel", GPT_FAMILY),
    (HYBRID, "HybridModel", HYBRID_FAMILY),
    (MAMBA, "MambaModel", HYBRID_FAMILY),
)
_UNWRAP = ("module", "language_model")

_SUPPORTED = (
    "GPTModel (megatron-core 0.13.1-0.19.2), HybridModel (0.18.2-0.19.2) or MambaModel with MTP (0.17.x), "
    "bare, through .module / .language_model wrappers (Float16Module, DDP, a VLM holder), or a list of chunks"
)


_FOUND: dict[str, tuple[type, str]] = {}  # class name -> (class, family), once its module was seen imported
_SEEN: list[int] = [-1]  # len(sys.modules) when the candidates were last looked for
_BY_TYPE: dict[type, str] = {}  # exact model types met so far -> family (the fast path)


def _classes() -> list[tuple[type, str]]:
    """(class, family) of every candidate whose module is imported (looked for again only after new imports)."""
    if len(_FOUND) < len(_CANDIDATES) and len(sys.modules) != _SEEN[0]:
        _SEEN[0] = len(sys.modules)
        for module_name, name, family in _CANDIDATES:
            module = sys.modules.get(module_name) if name not in _FOUND else None
            cls = getattr(module, name, None) if module is not None else None
            if isinstance(cls, type) and (module_name != MAMBA or hasattr(module, "process_mtp_loss")):
                _FOUND[name] = (cls, family)  # MambaModel before 0.17 has no MTP: refused as unsupported
    return list(_FOUND.values())


def _family_of(obj: Any, classes: list[tuple[type, str]]) -> str | None:
    for cls, family in classes:
        if isinstance(obj, cls):
            return family
    return None


def _walk(chunk: Any, classes: list[tuple[type, str]]) -> tuple[Any, str | None, list[Any]]:
    """The first supported model through ``.module`` / ``.language_model``, its family, and the chain walked."""
    chain: list[Any] = []
    obj = chunk
    while obj is not None and not any(obj is seen for seen in chain):
        chain.append(obj)
        family = _family_of(obj, classes)
        if family is not None:
            return obj, family, chain
        obj = next((inner for inner in (getattr(obj, u, None) for u in _UNWRAP) if inner is not None), None)
    return None, None, chain


def model_family(models: list[Any]) -> str:
    """The family of models already found by :func:`language_models` (they share one)."""
    return _BY_TYPE.get(type(models[0])) or _family_of(models[0], _classes()) or GPT_FAMILY


def language_models(model: Any) -> list[Any]:
    """The models ``mtp_patched`` patches in ``model``: itself, through wrappers, or one per chunk of a list.

    Every chunk must hold a supported model, all of one family; otherwise :class:`UnsupportedModelError`
    names the innermost model found (``Float16Module → BertModel``) and the remedy, and nothing is patched.
    """
    if type(model) in _BY_TYPE:  # a model class met before, passed bare
        return [model]
    classes = _classes()
    family = _family_of(model, classes)
    if family is not None:
        _BY_TYPE[type(model)] = family
        return [model]
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if not chunks:
        msg = f"mtp_patched got an empty list of model chunks; pass the model chunks your training step calls ({_SUPPORTED})."
        raise UnsupportedModelError(msg, target="[]")
    found, families = [], set()
    for index, chunk in enumerate(chunks):
        inner, family, chain = _walk(chunk, classes)
        if inner is None:
            raise _refusal(chain, index if isinstance(model, (list, tuple)) else None)
        found.append(inner)
        families.add(family)
    if len(families) > 1:
        names = ", ".join(f"chunk {i}: {type(m).__name__}" for i, m in enumerate(found))
        msg = (
            f"mtp_patched got model chunks of different families ({names}); the chunks of one model are all "
            "GPTModels or all HybridModels: enter one mtp_patched per model."
        )
        raise UnsupportedModelError(msg, target=names)
    return found


def _refusal(chain: list[Any], index: int | None) -> UnsupportedModelError:
    """The error for a chunk holding nothing we can patch: the chain of wrappers down to the innermost model."""
    path = " → ".join(type(obj).__name__ for obj in chain)
    innermost = type(chain[-1]).__name__
    where = f"chunk {index} " if index is not None else ""
    if innermost == "MambaModel":
        why = (
            f"MambaModel on megatron-core {mcore_version()} has no MTP (it has MTP in 0.17.x; from 0.18 use "
            "HybridModel, whose MTP mtp_patched supports)"
        )
    else:
        why = f"{innermost} is not a model mtp_patched can patch"
    msg = (
        f"mtp_patched cannot patch {where}{path}: {why}. It supports {_SUPPORTED}. If the model sits under "
        "another attribute of a wrapper, pass the inner model (or unwrap it first); if it is a model class with "
        f"MTP that mtp_patched does not know yet, report it (class {innermost}, megatron-core {mcore_version()})."
    )
    if index is not None:
        msg += " A chunk list is patched whole or not at all: nothing was patched."
    return UnsupportedModelError(msg, target=path)
