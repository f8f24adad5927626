"""Targets and patch sets for the value, create and mapping-item kinds (module constants, a registry dict, a config)."""

from __future__ import annotations

import collections
import dataclasses
from os import environ  # noqa: F401 (os.environ reached through another import path: kinds_sample:environ)

from patchreg import Patch, PatchSet, requires

M = "tests.patchreg.kinds_sample"

FLAG = False
HANDLER = object()
TABLE: dict[str, object] = {"gpt": HANDLER}


@dataclasses.dataclass
class Config:
    """A dataclass config, as Megatron-Core's TransformerConfig."""

    mtp_detach_heads: bool = False
    layers: int = 2


class Holder:
    """Holds a config and a mapping, as a model holds its config."""

    def __init__(self) -> None:
        self.config = Config()
        self.extra: dict[str, object] = {"seen": 1}


KINDS = PatchSet(
    "sample-kinds",
    [
        Patch("flag-on", f"{M}:FLAG", True, kind="value", doc="Turn the flag on."),
        Patch("env-var", "os:environ", "1", kind="item", key="PATCHREG_KINDS_SAMPLE", create=True),
        Patch("table-entry", f"{M}:TABLE", "mine", kind="item", key="mtp", create=True),
        Patch("new-const", f"{M}:ADDED", 7, kind="value", create=True, when=requires("attrs>=20")),
    ],
)


class Slotted:
    """An instance without a __dict__: what it has comes from its class."""

    __slots__ = ("__weakref__",)

    def method(self) -> str:
        return "class"


ORDERED: collections.OrderedDict[str, int] = collections.OrderedDict([("a", 1), ("b", 2), ("c", 3)])
MIXED: dict[str, object] = {"count": 3, "raw": b"bytes", "none": None}
