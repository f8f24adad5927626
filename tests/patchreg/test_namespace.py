"""Raw reads and writes (patchreg._namespace): the stored value along the MRO, binding, the put-back, environ's rules."""

from __future__ import annotations

import types

import pytest

from patchreg._namespace import (
    ABSENT,
    binding,
    build,
    environ_problem,
    holder_kind,
    label,
    put_back,
    same,
    stored_value,
)
from tests.patchreg import sample


def test_the_stored_value_is_read_from_vars_along_the_mro() -> None:
    """A class attribute is read raw (a staticmethod stays one), an inherited one from its owner, a missing one ABSENT."""
    assert isinstance(stored_value(sample.Child, "static"), staticmethod)
    assert stored_value(sample.Child, "inherited") is vars(sample.Base)["inherited"]
    assert stored_value(sample.Child, "nothing_here") is ABSENT
    assert stored_value(sample.Child(), "method") is vars(sample.Child)["method"]


def test_holder_kinds_and_labels() -> None:
    """Modules, classes and instances are told apart and named (an instance by type and address)."""
    child = sample.Child()
    assert [holder_kind(h) for h in (sample, sample.Child, child)] == ["module", "class", "instance"]
    assert label(sample) == sample.__name__ and label(sample.Child) == f"{sample.__name__}.Child"
    assert label(child).startswith("Child@0x")


def test_a_replacement_binds_as_the_attribute_it_shadows() -> None:
    """On an instance a function binds as a method where the class has a function, and stays plain otherwise."""
    child = sample.Child()

    def method(self: object) -> str:
        return "mine"

    bound = build("replace", method, "instance", child, "method", ABSENT)
    assert isinstance(bound, types.MethodType) and bound.__self__ is child and bound() == "mine"
    assert build("replace", method, "instance", child, "static", ABSENT) is method
    value, make = binding("replace", method, "instance", child, "method", ABSENT)
    assert value is None and make is not None and make(child).__self__ is child  # made per install: nothing kept
    assert binding("replace", method, "instance", child, "static", ABSENT) == (method, None)


class _Lowering(dict):  # type: ignore[type-arg]
    """A dict subclass whose __setitem__ stores another object than it was given."""

    def __setitem__(self, key: object, value: object) -> None:
        super().__setitem__(key, str(value).lower())


def test_a_raw_put_back_passes_a_dict_subclass_own_setitem() -> None:
    """put_back(raw=True) on a dict subclass writes the original itself, and removes an added key."""
    mapping = _Lowering()
    put_back("item", mapping, "k", "ORIGINAL")
    assert mapping["k"] == "original"
    put_back("item", mapping, "k", "ORIGINAL", raw=True)
    assert mapping["k"] == "ORIGINAL"
    put_back("item", mapping, "k", ABSENT, raw=True)
    assert "k" not in mapping


def test_same_compares_items_by_value_only_for_plain_types() -> None:
    """Items equal as str, bytes or numbers are the same (os.environ hands out new strs); other objects by identity."""
    assert same("item", "a" * 3, "".join(["a", "a", "a"]))
    assert not same("item", [1], [1]) and not same("instance", "".join(["a", "b"]), "ab" + "")
    assert not same("item", 1, True)


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [("A", "1", True), (1, "1", False), ("A", 1, False), ("", "1", False), ("A=B", "1", False), ("A", "\0", False)],
)
def test_environ_rules(key: object, value: object, ok: bool) -> None:
    """os.environ takes a non-empty str name without '=' or NUL, and a str value without NUL."""
    assert (environ_problem(key, value) is None) is ok
