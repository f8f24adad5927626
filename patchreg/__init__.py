"""patchreg: declarative, reversible, version-aware monkey patches."""

from __future__ import annotations

from patchreg._bootstrap import bootstrap, ray_runtime_env
from patchreg._disable import essential
from patchreg._discovery import VERSION as __version__
from patchreg._drift import Drift, Verified, body_fingerprint, drift
from patchreg._ledger import Report
from patchreg._predicates import (
    Answer,
    Predicate,
    accepts,
    always,
    check,
    has,
    not_needed_when,
    on_refresh,
    refresh,
    requires,
)
from patchreg._records import ABSENT, Backup, Installed, Patch, PatchSet
from patchreg._registry import Checkpoint, Explanation, Patched, Registry, apply, decorate, patched, registry, revert
from patchreg._targets import Selector
from patchreg._versions import provider
from patchreg.exceptions import (
    PatchConflictError,
    PatchDefinitionError,
    PatchError,
    PatchOwnershipError,
    PatchWarning,
    PredicateError,
    TargetNotFoundError,
    UnpatchableTargetError,
)

__all__ = [
    "ABSENT",
    "Answer",
    "Backup",
    "Checkpoint",
    "Drift",
    "Explanation",
    "Installed",
    "Patch",
    "PatchConflictError",
    "PatchDefinitionError",
    "PatchError",
    "PatchOwnershipError",
    "PatchSet",
    "PatchWarning",
    "Patched",
    "Predicate",
    "PredicateError",
    "Registry",
    "Report",
    "Selector",
    "TargetNotFoundError",
    "UnpatchableTargetError",
    "Verified",
    "__version__",
    "accepts",
    "always",
    "apply",
    "check",
    "decorate",
    "drift",
    "essential",
    "body_fingerprint",
    "bootstrap",
    "has",
    "not_needed_when",
    "on_refresh",
    "patched",
    "provider",
    "ray_runtime_env",
    "refresh",
    "registry",
    "requires",
    "revert",
]
