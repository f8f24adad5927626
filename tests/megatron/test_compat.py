"""patches.megatron._compat: signature adaptations read once per function object, bound as inspect would."""

from __future__ import annotations

import gc
import inspect
import weakref
from typing import Any

import pytest

from patches.megatron._compat import adapter, binder, call, call_kwargs
from patches.megatron.errors import MissingUpstreamArgumentError

pytestmark = [pytest.mark.no_distributed, pytest.mark.no_cpu_shims]


class Model:
    def _postprocess(self, hidden_states: Any, input_ids: Any, labels: Any, loss_mask: Any = None, *, extra: Any = 1):
        raise NotImplementedError

    def forward(self, tensor: Any, shifts: int = -1, cp_group: Any = None) -> tuple[Any, ...]:
        return (tensor, shifts, cp_group)


def _inspect_bind(func: Any, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = inspect.signature(func).bind(obj, *args, **kwargs)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k != "self"}


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"hidden_states": 1, "input_ids": 2, "labels": 3, "loss_mask": 4, "extra": 5}),  # all by keyword
        ((), {"hidden_states": 1, "input_ids": 2, "labels": 3}),
        ((1, 2, 3), {}),
        ((1, 2), {"labels": 3, "extra": 9}),
        ((1, 2, 3, 4), {"extra": None}),
    ],
)
def test_binder_binds_as_inspect_does(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The fast paths give inspect's bind + apply_defaults (without self)."""
    obj = Model()
    assert binder(Model._postprocess).bind(obj, args, kwargs) == _inspect_bind(Model._postprocess, obj, args, kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"hidden_states": 1, "input_ids": 2}),  # a required argument missing
        ((1, 2, 3), {"unknown": 1}),
        ((1, 2, 3), {"hidden_states": 1}),  # given twice
        ((1, 2, 3, 4, 5), {}),  # too many positional (extra is keyword-only)
    ],
)
def test_binder_raises_what_python_raises(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A call that does not fit the signature raises inspect's TypeError."""
    with pytest.raises(TypeError):
        binder(Model._postprocess).bind(Model(), args, kwargs)


def test_binder_and_adapter_are_cached_per_function() -> None:
    """One binder and one adapter per function object; bound methods share their function's."""
    assert binder(Model._postprocess) is binder(Model._postprocess)
    assert adapter(Model.forward) is adapter(Model.forward) is adapter(Model().forward)


def test_adapter_passes_what_the_callee_accepts() -> None:
    """Unknown names are dropped, defaults left to the callee, extra passed as given."""
    available = {"tensor": "t", "cp_group": "g", "packed_seq_params": "p"}
    assert call_kwargs(Model.forward, available) == {"tensor": "t", "cp_group": "g"}
    assert call(Model().forward, available, {"shifts": 2}) == ("t", 2, "g")
    with pytest.raises(MissingUpstreamArgumentError, match=r"Model\.forward.*'tensor'"):
        call_kwargs(Model.forward, {"shifts": -1})


def test_the_cache_keeps_no_instance_alive() -> None:
    """Adapting a bound method caches by its function: the instance is freed when dropped."""
    obj = Model()
    call(obj.forward, {"tensor": 1})
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert ref() is None
