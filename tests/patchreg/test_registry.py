"""Registry: install, count, restore exactly, conflicts, ownership, rollback, introspection."""

from __future__ import annotations

import functools
import gc
import logging
import threading
import types
import unittest.mock
import weakref
from typing import Any

import pytest
import wrapt

from patchreg import (
    ABSENT,
    Patch,
    PatchConflictError,
    PatchDefinitionError,
    PatchError,
    PatchOwnershipError,
    PatchSet,
    Registry,
    TargetNotFoundError,
    UnpatchableTargetError,
    check,
    not_needed_when,
    requires,
)
from tests.patchreg import sample
from tests.patchreg.helpers import assert_same_namespace, plain, snapshot, tagging_wrapper

M = "tests.patchreg.sample"


def test_module_function_restored_exactly(patch_registry: Registry, pristine: Any) -> None:
    """A module function is replaced for the block and the module dict is identical afterwards."""
    p = Patch("f", f"{M}:module_func", plain("patched"))
    with patch_registry.patched(p) as report:
        assert sample.module_func(1) == "patched"
        assert report.installed == 1
    assert sample.module_func(1) == 2
    pristine()


@pytest.mark.parametrize(
    ("attr", "call"),
    [
        ("method", lambda: sample.Child().method()),
        ("static", lambda: sample.Child.static(3)),
        ("klass", lambda: sample.Child.klass()),
    ],
)
def test_class_method_kinds_restored_as_raw_descriptor(
    patch_registry: Registry, pristine: Any, attr: str, call: Any
) -> None:
    """Methods, staticmethods and classmethods are replaced and come back as the raw descriptor."""
    raw = vars(sample.Child)[attr]
    with patch_registry.patched(Patch("p", f"{M}:Child.{attr}", plain("patched"))):
        assert call() == "patched"
        assert type(vars(sample.Child)[attr]) is type(raw)
    assert vars(sample.Child)[attr] is raw
    pristine()


def test_property_and_cached_property_restored(patch_registry: Registry, pristine: Any) -> None:
    """property and functools.cached_property replaced by descriptors come back as the same objects."""
    patches = PatchSet(
        "props",
        [
            Patch("prop", f"{M}:Child.prop", property(lambda self: "new-prop")),
            Patch("cached", f"{M}:Child.cached", functools.cached_property(lambda self: "new-cached")),
        ],
    )
    with patch_registry.patched(patches):
        child = sample.Child()
        assert (child.prop, child.cached) == ("new-prop", "new-cached")
    child = sample.Child()
    assert (child.prop, child.cached) == ("prop", "cached")
    pristine()


def test_inherited_method_is_deleted_not_copied_down(patch_registry: Registry, pristine: Any) -> None:
    """Patching an inherited method on the subclass removes the key from vars(subclass) on revert."""
    assert "inherited" not in vars(sample.Child)
    with patch_registry.patched(Patch("p", f"{M}:Child.inherited", plain("patched"))):
        assert "inherited" in vars(sample.Child)
        assert sample.Child().inherited() == "patched"
        assert sample.Base().inherited() == "base"
    assert "inherited" not in vars(sample.Child)
    assert sample.Child.__dict__.get("inherited", ABSENT) is ABSENT
    pristine()


def test_nested_class_attribute(patch_registry: Registry, pristine: Any) -> None:
    """An import path through a nested class patches the nested class."""
    with patch_registry.patched(Patch("p", f"{M}:Child.Nested.deep", plain("patched"))):
        assert sample.Child.Nested().deep() == "patched"
    assert sample.Child.Nested().deep() == "deep"
    pristine()


def test_module_constant_replaced_by_callable_only(patch_registry: Registry, pristine: Any) -> None:
    """A module attribute that did not exist before is removed again on revert."""
    p = Patch("p", f"{M}:module_func", plain(1))
    with patch_registry.patched(p):
        pass
    pristine()


def test_instance_attribute_absent_before(patch_registry: Registry) -> None:
    """A selector patch on an instance shadows the class method and leaves vars() as before."""
    leaf = sample.Leaf()
    before = snapshot(leaf)
    seen = []

    def forward(self: sample.Leaf, x: int) -> tuple[str, int]:
        seen.append(self)
        return ("patched", x)

    with patch_registry.patched(Patch("fw", "forward", forward), leaf):
        assert leaf.forward(1) == ("patched", 1)
        assert sample.Leaf().forward(1) == ("leaf", 1)
    assert seen == [leaf]
    assert_same_namespace(before, leaf)


def test_instance_attribute_present_before(patch_registry: Registry) -> None:
    """An instance attribute present before comes back as the same object."""
    leaf = sample.Leaf()
    own = lambda x: ("own", x)  # noqa: E731
    leaf.forward = own  # type: ignore[method-assign]
    before = snapshot(leaf)
    with patch_registry.patched(Patch("fw", "forward", plain("patched")), leaf):
        assert leaf.forward(1) == "patched"
    assert leaf.forward is own
    assert_same_namespace(before, leaf)


def test_staticmethod_and_classmethod_shadowed_on_instance(patch_registry: Registry) -> None:
    """On an instance, a staticmethod stays unbound and a classmethod is bound to the class."""
    child = sample.Child()
    patches = PatchSet(
        "s",
        [Patch("st", "static", lambda x: ("static", x)), Patch("cm", "klass", lambda cls: ("klass", cls))],
    )
    with patch_registry.patched(patches, child):
        assert child.static(2) == ("static", 2)
        assert child.klass() == ("klass", sample.Child)
    assert vars(child) == {}


def test_idempotent_apply_counts(patch_registry: Registry) -> None:
    """A second apply installs nothing and the original returns after the last revert."""
    p = Patch("f", f"{M}:module_func", plain("patched"))
    first = patch_registry.apply(p)
    second = patch_registry.apply(p)
    assert (first.installed, second.installed) == (1, 0)
    assert patch_registry.active()[0].count == 2
    assert patch_registry.revert(p) == 0
    assert sample.module_func(1) == "patched"
    assert patch_registry.revert(p) == 1
    assert sample.module_func(1) == 2
    assert patch_registry.revert(p) == 0


def test_nested_and_repeated_blocks(patch_registry: Registry, pristine: Any) -> None:
    """Nested with blocks on one patch keep it until the outer block ends."""
    p = Patch("f", f"{M}:module_func", plain("patched"))
    block = patch_registry.patched(p)
    with block as outer:
        with block as inner:
            assert (outer.installed, inner.installed) == (1, 0)
        assert sample.module_func(1) == "patched"
    pristine()
    with block:
        assert sample.module_func(1) == "patched"
    pristine()


def test_exception_inside_block_restores(patch_registry: Registry, pristine: Any) -> None:
    """An exception in the with body propagates and the originals are back."""
    p = Patch("f", f"{M}:module_func", plain("patched"))
    with pytest.raises(RuntimeError, match="boom"), patch_registry.patched(p):
        raise RuntimeError("boom")
    assert patch_registry.active() == ()
    pristine()


def test_decorator_form(patch_registry: Registry, pristine: Any) -> None:
    """patched() used as a decorator applies around each call."""

    @patch_registry.patched(Patch("f", f"{M}:module_func", plain("patched")))
    def run() -> Any:
        return sample.module_func(1)

    assert run() == "patched"
    assert run.__name__ == "run"
    pristine()


def test_partial_failure_rolls_back(patch_registry: Registry, pristine: Any) -> None:
    """When the k-th install fails, the k-1 installed by the same call are reverted."""
    good = Patch("good", f"{M}:module_func", plain("patched"))
    bad = Patch("bad", "builtins:int.__add__", plain(0))
    with pytest.raises(UnpatchableTargetError, match="immutable"):
        patch_registry.apply(PatchSet("s", [good, bad]))
    assert patch_registry.active() == ()
    pristine()


def test_failure_while_installing_rolls_back(patch_registry: Registry, pristine: Any) -> None:
    """A conflict found at the second patch of a set leaves the first uninstalled again."""
    holder = Patch("holder", f"{M}:Child.method", plain("first"))
    with patch_registry.patched(holder):
        setpatches = PatchSet(
            "s", [Patch("a", f"{M}:module_func", plain(1)), Patch("b", f"{M}:Child.method", plain(2))]
        )
        with pytest.raises(PatchConflictError):
            patch_registry.apply(setpatches)
        assert sample.module_func(1) == 2
        assert [e.patch for e in patch_registry.active()] == ["holder"]
    pristine()


def test_keyboard_interrupt_between_installs_rolls_back(patch_registry: Registry, pristine: Any) -> None:
    """A KeyboardInterrupt raised while a set is being installed leaves nothing installed."""

    class Exploding:
        def __get__(self, obj: Any, cls: Any) -> Any:
            raise KeyboardInterrupt

        def __call__(self) -> None:
            pass

    leaf = sample.Leaf()
    patches = PatchSet("s", [Patch("a", f"{M}:module_func", plain(1)), Patch("b", "forward", Exploding())])
    with pytest.raises(KeyboardInterrupt):
        patch_registry.apply(patches, leaf)
    assert patch_registry.active() == ()
    assert vars(leaf) == {"tag": "leaf"}
    pristine()


def test_two_replaces_conflict(patch_registry: Registry, pristine: Any) -> None:
    """A second replace patch on the same attribute raises PatchConflictError naming both."""
    a = Patch("alpha", f"{M}:Child.method", plain("a"))
    b = Patch("beta", f"{M}:Child.method", plain("b"))
    with patch_registry.patched(a), pytest.raises(PatchConflictError, match=r"'beta'.*'alpha'"):
        patch_registry.apply(b)
    pristine()


def test_replace_over_wrap_conflicts(patch_registry: Registry, pristine: Any) -> None:
    """A replace over an active wrap would discard the wrapper, so it conflicts."""
    w = Patch("w", f"{M}:Child.method", tagging_wrapper("w"), kind="wrap")
    r = Patch("r", f"{M}:Child.method", plain("r"))
    with patch_registry.patched(w), pytest.raises(PatchConflictError, match="discard"):
        patch_registry.apply(r)
    pristine()


def test_wraps_stack_and_unwind_lifo(patch_registry: Registry, pristine: Any) -> None:
    """Wrap patches stack over a replace and unwind last-in first-out."""
    r = Patch("r", f"{M}:Child.method", plain("r"))
    w1 = Patch("w1", f"{M}:Child.method", tagging_wrapper("w1"), kind="wrap")
    w2 = Patch("w2", f"{M}:Child.method", tagging_wrapper("w2"), kind="wrap")
    with patch_registry.patched(r), patch_registry.patched(w1), patch_registry.patched(w2):
        assert sample.Child().method() == ("w2", ("w1", "r"))
        assert isinstance(vars(sample.Child)["method"], wrapt.FunctionWrapper)
    pristine()


def test_out_of_order_revert_refused(patch_registry: Registry, pristine: Any) -> None:
    """Reverting a lower wrap before the one stacked on it raises and changes nothing."""
    w1 = Patch("w1", f"{M}:Child.method", tagging_wrapper("w1"), kind="wrap")
    w2 = Patch("w2", f"{M}:Child.method", tagging_wrapper("w2"), kind="wrap")
    patch_registry.apply(w1)
    patch_registry.apply(w2)
    with pytest.raises(PatchOwnershipError, match=r"'w1'.*before patch 'w2'"):
        patch_registry.revert(w1)
    assert sample.Child().method() == ("w2", ("w1", "child-method"))
    assert patch_registry.revert(w2) == 1
    assert patch_registry.revert(w1) == 1
    pristine()


def test_wrap_on_instance_gets_instance(patch_registry: Registry) -> None:
    """A wrap patch on an instance method receives the instance and the bound original."""
    leaf = sample.Leaf("x")
    seen = []

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        seen.append(instance)
        return ("w", wrapped(*args, **kwargs))

    with patch_registry.patched(Patch("w", "forward", wrapper, kind="wrap"), leaf):
        assert leaf.forward(3) == ("w", ("x", 3))
    assert seen == [leaf]
    assert vars(leaf) == {"tag": "x"}


def test_ownership_error_when_patched_over(patch_registry: Registry, pristine: Any) -> None:
    """A foreign patch over ours makes revert raise PatchOwnershipError; nothing is lost."""
    p = Patch("f", f"{M}:Child.method", plain("ours"))
    patch_registry.apply(p)
    with unittest.mock.patch.object(sample.Child, "method", plain("mock")):
        with pytest.raises(PatchOwnershipError, match="someone patched over it"):
            patch_registry.revert(p)
        assert sample.Child().method() == "mock"
    assert sample.Child().method() == "ours"
    assert patch_registry.revert(p) == 1
    pristine()


def test_ownership_on_instance_and_block_exit(patch_registry: Registry) -> None:
    """A block whose attribute was overwritten raises at exit, and a later revert works."""
    leaf = sample.Leaf()
    p = Patch("fw", "forward", plain("ours"))
    block = patch_registry.patched(p, leaf)
    with pytest.raises(PatchOwnershipError), block:
        saved = vars(leaf)["forward"]
        leaf.forward = plain("foreign")  # type: ignore[method-assign]
    assert leaf.forward(1) == "foreign"
    vars(leaf)["forward"] = saved
    assert patch_registry.revert(p, leaf) == 1
    assert vars(leaf) == {"tag": "leaf"}


def test_a_foreign_none_over_a_freed_install_is_not_taken_for_ours(patch_registry: Registry) -> None:
    """Once the bound method we installed is gone, a None put there is foreign: kept, and revert raises."""
    leaf = sample.Leaf()
    p = Patch("fw", "forward", plain("ours"))
    report = patch_registry.apply(p, leaf)
    leaf.forward = None  # type: ignore[assignment,method-assign]  # our bound method is freed here
    with pytest.raises(PatchOwnershipError, match="holds None"):
        patch_registry.revert(report)
    assert vars(leaf)["forward"] is None
    del leaf.forward  # the remedy the error names: undo the foreign patch
    assert patch_registry.revert(report) == 1
    assert vars(leaf) == {"tag": "leaf"} and not patch_registry.active()


@pytest.mark.parametrize("where", ["instance", "class"])
def test_an_install_removed_by_someone_else_releases_when_nothing_was_there(
    patch_registry: Registry, pristine: Any, where: str
) -> None:
    """Overwritten and then deleted by foreign code: the original state (no attribute) is back, so the
    release succeeds instead of refusing forever; nothing is written."""
    if where == "instance":
        holder: Any = sample.Leaf()
        p = Patch("fw", "forward", plain("ours"))
        report = patch_registry.apply(p, holder)
    else:
        holder = sample.Child
        p = Patch("inh", f"{M}:Child.inherited", plain("ours"))  # defined on Base: nothing on Child before
        report = patch_registry.apply(p)
    name = "forward" if where == "instance" else "inherited"
    setattr(holder, name, plain("foreign"))
    delattr(holder, name)
    assert patch_registry.revert(report) == 1
    assert not patch_registry.active()
    pristine()
    if where == "instance":
        assert vars(holder) == {"tag": "leaf"}


def test_unpatchable_targets_refused_before_change(patch_registry: Registry, pristine: Any) -> None:
    """Slots instances, data descriptors on instances and immutable types are refused up front."""
    cases = [
        (Patch("a", "method", plain(1)), sample.Slotted()),
        (Patch("b", "prop", plain(1)), sample.Child()),
        (Patch("c", "builtins:int.__add__", plain(1)), None),
        (Patch("d", f"{M}:Child.prop", tagging_wrapper("w"), kind="wrap"), None),
    ]
    for patch, obj in cases:
        with pytest.raises(UnpatchableTargetError) as info:
            patch_registry.apply(PatchSet("s", [Patch("ok", f"{M}:module_func", plain(1)), patch]), obj)
        assert patch.name in str(info.value) or str(patch.where) in str(info.value) or "Slotted" in str(info.value)
    assert patch_registry.active() == ()
    pristine()


def test_selector_needs_an_instance(patch_registry: Registry) -> None:
    """A selector applied to None, a class or a module raises with the remedy."""
    p = Patch("fw", "forward", plain(1))
    for obj, text in [(None, "got None"), (sample.Leaf, "import path"), (sample, "module")]:
        with pytest.raises(UnpatchableTargetError, match=text):
            patch_registry.apply(p, obj)


def test_skips_and_strict(patch_registry: Registry) -> None:
    """Misses and false predicates are skips with reasons; strict=True raises before installing."""
    patches = PatchSet(
        "s",
        [
            Patch("miss", "nothing_here", plain(1)),
            Patch("old", f"{M}:module_func", plain(1), when=requires("attrs<1")),
            Patch("gone", "no_such_module_xyz:f", plain(1)),
            Patch("ok", "forward", plain(1)),
        ],
    )
    leaf = sample.Leaf()
    report = patch_registry.apply(patches, leaf)
    reasons = dict(report.skipped)
    assert "has no attribute 'nothing_here'" in reasons["miss"]
    assert "does not satisfy <1" in reasons["old"]
    assert "cannot import no_such_module_xyz" in reasons["gone"]
    assert report.installed == 1
    patch_registry.revert(report)
    with pytest.raises(TargetNotFoundError, match="strict=True"):
        patch_registry.apply(patches, leaf, strict=True)
    assert patch_registry.active() == ()


def test_warn_logs_skips(patch_registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """apply(warn=True) logs each skip as a warning on the patchreg logger."""
    with caplog.at_level(logging.WARNING, logger="patchreg"):
        patch_registry.apply(Patch("miss", "nothing_here", plain(1)), sample.Leaf(), warn=True)
    assert "miss skipped" in caplog.text


def test_revert_by_report_once(patch_registry: Registry) -> None:
    """Reverting a Report releases exactly its references, and only once."""
    p = Patch("f", f"{M}:module_func", plain("patched"))
    r1 = patch_registry.apply(p)
    r2 = patch_registry.apply(p)
    assert patch_registry.revert(r1) == 0
    assert patch_registry.revert(r1) == 0
    assert sample.module_func(1) == "patched"
    assert patch_registry.revert(r2) == 1


def test_report_from_other_registry_refused(patch_registry: Registry) -> None:
    """A Report can only be reverted by the registry that made it."""
    report = patch_registry.apply(Patch("f", f"{M}:module_func", plain(1)))
    with pytest.raises(Exception, match="revert it there"):
        Registry("other").revert(report)
    patch_registry.revert(report)


def test_fan_out_over_chunks_and_wrappers(patch_registry: Registry) -> None:
    """A selector reaches through .module and .language_model and over a list of chunks."""
    trees = [sample.Tree(2), sample.Tree(3)]
    model = [sample.Wrapper(sample.Wrapper(trees[0])), sample.VLM(trees[1])]
    p = Patch("fw", "blocks[*].forward", plain("patched"))
    with patch_registry.patched(p, model) as report:
        assert report.installed == 5
        assert all(b.forward(1) == "patched" for t in trees for b in t.blocks)
        assert trees[0].head.forward(1) == ("head", 1)
        assert patch_registry.is_active("fw", model)
        assert patch_registry.is_active("fw", trees[1].blocks[2])
        assert not patch_registry.is_active("fw", sample.Tree())
    assert all(vars(b) == {"tag": b.tag} for t in trees for b in t.blocks)


def test_two_objects_share_no_state(patch_registry: Registry) -> None:
    """The same selector patch on two objects counts and restores each separately."""
    a, b = sample.Leaf("a"), sample.Leaf("b")
    p = Patch("fw", "forward", plain("patched"))
    ra = patch_registry.apply(p, a)
    with patch_registry.patched(p, b):
        assert (a.forward(1), b.forward(1)) == ("patched", "patched")
    assert (a.forward(1), b.forward(1)) == ("patched", ("b", 1))
    patch_registry.revert(ra)
    assert vars(a) == {"tag": "a"}


def test_freed_by_refcount_after_revert(patch_registry: Registry) -> None:
    """A patched and reverted object dies on del with gc disabled (no cycles left)."""
    gc.disable()
    try:
        tree = sample.Tree()
        with patch_registry.patched(
            PatchSet("s", [Patch("a", "blocks[*].forward", plain(1)), Patch("b", "forward", plain(2))]), tree
        ) as report:
            pass
        ref = weakref.ref(tree)
        del tree
        assert ref() is None
        assert report.installed == 3
    finally:
        gc.enable()


def test_registry_does_not_keep_patched_object_alive(patch_registry: Registry) -> None:
    """An object dropped while patched is collected and disappears from active()."""
    leaf = sample.Leaf()
    p = Patch("fw", "forward", plain(1))
    patch_registry.apply(p, leaf)
    assert len(patch_registry.active()) == 1
    ref = weakref.ref(leaf)
    del leaf
    gc.collect()
    assert ref() is None
    assert patch_registry.active() == ()
    assert len(p.backup) == 0


def test_backup_slot_holds_original(patch_registry: Registry) -> None:
    """The patch's backup slot holds the displaced original, keyed by the holder."""
    p = Patch("f", f"{M}:Child.method", plain(1))
    raw = vars(sample.Child)["method"]
    with patch_registry.patched(p):
        assert p.backup.get(sample.Child) is raw
        assert sample.Child in p.backup
    assert p.backup.get(sample.Child) is None
    assert sample.Child not in p.backup


def test_backup_stacks_across_registries_newest_on_top(patch_registry: Registry) -> None:
    """One patch applied by two registries on one holder: the backup shows the newest original first."""
    p = Patch("f", "forward", tagging_wrapper("t"), kind="wrap")
    leaf = sample.Leaf()
    other = Registry("other")
    with patch_registry.patched(p, leaf):
        first = vars(leaf)["forward"]
        with other.patched(p, leaf):
            assert p.backup.get(leaf) is first and len(p.backup) == 1 and leaf in p.backup
        assert p.backup.get(leaf) is ABSENT
    assert p.backup.get(leaf, "none") == "none" and repr(p.backup) == "<Backup of 0 object(s)>"


def test_predicate_error_installs_nothing(patch_registry: Registry, pristine: Any) -> None:
    """A predicate that raises surfaces as PredicateError and nothing is installed."""
    from patchreg import PredicateError

    def broken() -> bool:
        raise ZeroDivisionError

    patches = PatchSet(
        "s",
        [
            Patch("a", f"{M}:module_func", plain(1)),
            Patch("b", f"{M}:Child.method", plain(1), when=check(broken, "broken")),
        ],
    )
    with pytest.raises(PredicateError, match="broken"):
        patch_registry.apply(patches)
    assert patch_registry.active() == ()
    pristine()


def test_introspection(patch_registry: Registry) -> None:
    """active(), is_active(), summary(), explain(), repr() and fingerprint() describe the state."""
    leaf = sample.Leaf()
    patches = PatchSet(
        "s",
        [Patch("fw", "forward", plain(1)), Patch("f", f"{M}:module_func", plain(1)), Patch("miss", "nope", plain(1))],
    )
    assert "nothing active" in patch_registry.summary()
    empty = patch_registry.fingerprint()
    explained = str(patch_registry.explain(patches, leaf))
    assert "install" in explained and "skip" in explained
    with patch_registry.patched(patches, leaf):
        assert {e.patch for e in patch_registry.active()} == {"fw", "f"}
        assert patch_registry.is_active("fw", leaf) and patch_registry.is_active("f")
        assert not patch_registry.is_active("fw", sample.Leaf())
        text = patch_registry.summary()
        assert "fw" in text and "model.forward" in text and "@0x" not in text and "count" in text
        assert "share" in str(patch_registry.explain(patches, leaf))
        assert "2 active install(s)" in repr(patch_registry)
        assert "\n" not in repr(patch_registry)
        assert patch_registry.fingerprint() != empty
    assert patch_registry.fingerprint() == empty


def test_explain_changes_nothing(patch_registry: Registry) -> None:
    """explain() reports conflicts without installing anything."""
    a = Patch("a", f"{M}:Child.method", plain(1))
    b = Patch("b", f"{M}:Child.method", plain(2))
    with patch_registry.patched(a):
        assert "conflict" in str(patch_registry.explain(b))
        assert len(patch_registry.active()) == 1


def test_threads_never_see_patch_vanish(patch_registry: Registry, pristine: Any) -> None:
    """8 threads x 1,000 enter/exit cycles on one class patch: always visible inside, pristine after."""
    p = Patch("m", f"{M}:Child.method", plain("patched"))
    errors: list[BaseException] = []
    block = patch_registry.patched(p)

    def worker() -> None:
        try:
            for _ in range(1000):
                with block:
                    assert sample.Child().method() == "patched"
        except BaseException as exc:  # collected for the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert patch_registry.active() == ()
    pristine()


def test_revert_all(patch_registry: Registry, pristine: Any) -> None:
    """revert_all() restores everything regardless of counts."""
    p = Patch("f", f"{M}:module_func", plain(1))
    patch_registry.apply(p)
    patch_registry.apply(p)
    assert patch_registry.revert_all() == 1
    pristine()


def test_checkpoint_and_rollback(patch_registry: Registry, pristine: Any) -> None:
    """rollback() releases only the users added since the checkpoint, top layers first."""
    r = Patch("r", f"{M}:Child.method", plain("r"))
    w = Patch("w", f"{M}:Child.method", tagging_wrapper("w"), kind="wrap")
    f = Patch("f", f"{M}:module_func", plain(1))
    patch_registry.apply(r)
    checkpoint = patch_registry.checkpoint()
    patch_registry.apply(r)
    patch_registry.apply(w)
    patch_registry.apply(f)
    assert repr(checkpoint) == "<Checkpoint of 1 install(s) in 'test'>"
    assert patch_registry.rollback(checkpoint) == 2
    assert [(e.patch, e.count) for e in patch_registry.active()] == [("r", 1)]
    assert sample.Child().method() == "r"
    with pytest.raises(Exception, match="roll back there"):
        Registry("other").rollback(checkpoint)
    patch_registry.revert(r)
    pristine()


# -- two registries on one attribute ---------------------------------------------------------


def test_same_patch_in_two_registries_unwinds_top_first(patch_registry: Registry, pristine: Any) -> None:
    """The same replace patch applied by two registries stacks; the lower revert waits for the upper."""
    p = Patch("p", f"{M}:Child.method", plain("p"))
    other = Registry("other")
    lower = patch_registry.apply(p)
    upper = other.apply(p)
    with pytest.raises(PatchOwnershipError, match="through another registry; revert that one first") as info:
        patch_registry.revert(lower)
    assert "'p'" in str(info.value)
    assert [e.count for e in other.active()] == [1] and [e.count for e in patch_registry.active()] == [1]
    with pytest.raises(PatchOwnershipError):
        patch_registry.revert_all()
    assert sample.Child().method() == "p"
    assert other.revert(upper) == 1
    assert sample.Child().method() == "p"  # the lower install is back on top
    assert patch_registry.revert(lower) == 1
    pristine()


def test_interleaved_registries_refuse_to_release_under_a_foreign_layer(
    patch_registry: Registry, pristine: Any
) -> None:
    """A wraps, B wraps over it, A wraps again: A cannot release both of its layers (B's is between)."""
    w1 = Patch("w1", f"{M}:module_func", tagging_wrapper("w1"), kind="wrap")
    w2 = Patch("w2", f"{M}:module_func", tagging_wrapper("w2"), kind="wrap")
    wb = Patch("wb", f"{M}:module_func", tagging_wrapper("wb"), kind="wrap")
    other = Registry("other")
    checkpoint = patch_registry.checkpoint()
    patch_registry.apply(w1)
    report_b = other.apply(wb)
    report_2 = patch_registry.apply(w2)
    stacked = vars(sample)["module_func"]
    for release in (
        lambda: patch_registry.rollback(checkpoint),
        lambda: patch_registry.revert(PatchSet("s", [w1, w2])),
    ):
        with pytest.raises(PatchOwnershipError, match="wb"):
            release()
        assert vars(sample)["module_func"] is stacked  # nothing changed
    with pytest.raises(PatchOwnershipError):
        other.revert(report_b)  # w2 is over it
    assert patch_registry.revert(report_2) == 1
    assert other.revert(report_b) == 1
    assert patch_registry.rollback(checkpoint) == 1
    pristine()


@pytest.mark.parametrize("kind", ["replace", "wrap"])
def test_replace_over_another_registrys_patch_conflicts(patch_registry: Registry, pristine: Any, kind: str) -> None:
    """A replace over another registry's install conflicts as in one registry; nothing is installed."""
    below = Patch(
        "below", f"{M}:Child.method", plain("below") if kind == "replace" else tagging_wrapper("w"), kind=kind
    )  # type: ignore[arg-type]
    other = Registry("other")
    with other.patched(below):
        with pytest.raises(PatchConflictError, match="patch 'below' \\(in registry 'other'\\)"):
            patch_registry.apply(Patch("top", f"{M}:Child.method", plain("top")))
        assert patch_registry.active() == ()
        with patch_registry.patched(Patch("wrap", f"{M}:Child.method", tagging_wrapper("t"), kind="wrap")):
            pass  # a wrap stacks over it
    pristine()


# -- a wrap of an inherited attribute that another install replaced -------------------------------


@pytest.mark.parametrize("registries", ["one", "two"])
@pytest.mark.parametrize("where", ["instance", "subclass"])
def test_a_wrap_over_an_inherited_replace_holds_it_until_reverted(where: str, registries: str, pristine: Any) -> None:
    """A wrap on an instance (or subclass) calls the class's replaced method: that replace waits for the wrap."""
    lower = Registry("lower")
    upper = lower if registries == "one" else Registry("upper")
    child = sample.Child()
    replace = lower.apply(Patch("r", f"{M}:Base.inherited", plain("replaced")))
    if where == "instance":
        wrap = upper.apply(Patch("w", "inherited", tagging_wrapper("w"), kind="wrap"), child)
    else:  # Child inherits it: the wrap goes on Child, over what Base now holds
        wrap = upper.apply(Patch("w", f"{M}:Child.inherited", tagging_wrapper("w"), kind="wrap"))
    assert child.inherited() == ("w", "replaced")
    with pytest.raises(PatchOwnershipError, match="which wraps it"):
        lower.revert(replace)
    assert child.inherited() == ("w", "replaced") and lower.is_active("r")  # nothing changed
    upper.revert(wrap)
    assert lower.revert(replace) == 1
    assert child.inherited() == "base"
    pristine()


def test_revert_all_releases_a_wrap_before_the_replace_it_wraps(patch_registry: Registry, pristine: Any) -> None:
    """revert_all (and one report holding both) release across attributes last installed first."""
    child = sample.Child()
    both = PatchSet(
        "both",
        (
            Patch("r", f"{M}:Base.inherited", plain("replaced")),
            Patch("w", f"{M}:Child.inherited", tagging_wrapper("w"), kind="wrap"),
        ),
    )
    with patch_registry.patched(both):
        assert child.inherited() == ("w", "replaced")
    pristine()
    patch_registry.apply(both)
    patch_registry.apply(Patch("w2", "inherited", tagging_wrapper("w2"), kind="wrap"), child)
    assert child.inherited() == ("w2", ("w", "replaced"))
    assert patch_registry.revert_all() == 3
    assert child.inherited() == "base" and vars(child) == {}
    pristine()


def test_a_refused_batch_release_keeps_every_cover(pristine: Any) -> None:
    """A revert_all refused part-way (another registry's wrap over one install) forgets no wrap-over-replace cover."""
    a, b = Registry("a"), Registry("b")
    a.apply(Patch("f-a", f"{M}:module_func", tagging_wrapper("a"), kind="wrap"))
    b.apply(Patch("f-b", f"{M}:module_func", tagging_wrapper("b"), kind="wrap"))  # a's wrap is under b's
    replace = a.apply(Patch("r", f"{M}:Base.inherited", plain("replaced")))
    a.apply(Patch("w", f"{M}:Child.inherited", tagging_wrapper("w"), kind="wrap"))  # wraps a's replace
    with pytest.raises(PatchOwnershipError, match="f-b"):
        a.revert_all()  # w, then r (after w in the same batch), then f-a: refused there
    with pytest.raises(PatchOwnershipError, match="which wraps it"):
        a.revert(replace)  # w still calls it
    assert sample.Child().inherited() == ("w", "replaced")
    b.revert_all()
    assert a.revert_all() == 3
    pristine()


# -- checkpoints ----------------------------------------------------------------------------------


def test_rollback_marks_the_applies_since_released(patch_registry: Registry, pristine: Any) -> None:
    """A block rolled back from inside exits without releasing the outer block's user."""
    p = Patch("p", f"{M}:Child.method", plain("p"))
    with patch_registry.patched(p):
        checkpoint = patch_registry.checkpoint()
        with patch_registry.patched(p) as inner:
            assert patch_registry.rollback(checkpoint) == 0
            assert inner.reverted and inner.held == 0
        assert sample.Child().method() == "p"  # the outer user still holds it
        assert [e.count for e in patch_registry.active()] == [1]
    pristine()


def test_rollback_is_all_or_nothing_across_applies(patch_registry: Registry, pristine: Any) -> None:
    """One apply since the checkpoint that cannot be released leaves every other one in place."""
    f = Patch("f", f"{M}:module_func", plain("f"))
    m = Patch("m", f"{M}:Child.method", plain("m"))
    checkpoint = patch_registry.checkpoint()
    patch_registry.apply(f)
    patch_registry.apply(m)
    with unittest.mock.patch.object(sample, "module_func", plain("mock")):
        with pytest.raises(PatchOwnershipError):
            patch_registry.rollback(checkpoint)
        assert sample.Child().method() == "m"
    assert patch_registry.rollback(checkpoint) == 2
    pristine()


def test_revert_of_a_set_releases_in_install_order(patch_registry: Registry, pristine: Any) -> None:
    """revert(set) unwinds the last-installed layer first, whatever order the set lists them in."""
    w1 = Patch("w1", f"{M}:module_func", tagging_wrapper("w1"), kind="wrap")
    w2 = Patch("w2", f"{M}:module_func", tagging_wrapper("w2"), kind="wrap")
    patch_registry.apply(w2)
    patch_registry.apply(w1)
    assert patch_registry.revert(PatchSet("s", [w1, w2])) == 2
    pristine()


# -- namespaces that do not store what was set ----------------------------------------------


def test_metaclass_setattr_that_changes_the_value_is_refused(patch_registry: Registry) -> None:
    """A class whose metaclass stores something else than what is set: refused, original kept, nothing recorded."""

    class Meta(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            if callable(value) and not isinstance(value, type):
                inner = value
                value = functools.wraps(inner)(lambda *a, **k: inner(*a, **k))
            super().__setattr__(name, value)

    class Odd(metaclass=Meta):
        def f(self) -> str:
            return "f"

    original = vars(Odd)["f"]
    sample.Odd = Odd  # type: ignore[attr-defined]
    try:
        with pytest.raises(UnpatchableTargetError, match=r"stored .* instead of the replacement"):
            patch_registry.apply(Patch("p", f"{M}:Odd.f", plain("p")))
        assert vars(Odd)["f"] is original
        assert patch_registry.active() == ()
    finally:
        del sample.Odd  # type: ignore[attr-defined]


def test_metaclass_setattr_that_changes_the_value_on_restore_is_bypassed(patch_registry: Registry) -> None:
    """A metaclass that transforms plain functions set on its classes: the revert still puts back the very original."""

    class Tracing(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            if type(value) is types.FunctionType:
                inner = value
                value = functools.wraps(inner)(lambda *a, **k: inner(*a, **k))
            super().__setattr__(name, value)

    class Traced(metaclass=Tracing):
        def m(self) -> str:
            return "orig"

    before = snapshot(Traced)
    sample.Traced = Traced  # type: ignore[attr-defined]
    try:
        wrap = Patch("w", f"{M}:Traced.m", tagging_wrapper("w"), kind="wrap")  # a FunctionWrapper: stored as set
        with patch_registry.patched(wrap) as report:
            assert report.installed == 1 and Traced().m() != "orig"
        assert_same_namespace(before, Traced)  # not the metaclass's copy of the original
        assert patch_registry.active() == ()
    finally:
        del sample.Traced  # type: ignore[attr-defined]


def test_a_class_changed_by_someone_else_is_checked_again(patch_registry: Registry) -> None:
    """A data descriptor put on the class by another tool after a first instance patch: the next one is refused."""

    class Leaf:
        def m(self) -> str:
            return "orig"

    p = Patch("p", "m", plain("patched"))
    with patch_registry.patched(p, Leaf()):
        pass  # Leaf.m was a plain method then
    with unittest.mock.patch.object(Leaf, "m", new_callable=unittest.mock.PropertyMock, return_value="mocked"):
        leaf = Leaf()
        with pytest.raises(UnpatchableTargetError, match="data descriptor"):
            patch_registry.apply(p, leaf)
        assert vars(leaf) == {} and patch_registry.active() == ()


def test_class_patch_rechecks_what_instances_may_take(patch_registry: Registry, pristine: Any) -> None:
    """After a class patch turns a method into a property, an instance patch of it is refused (not cached)."""
    leaf = sample.Child()
    with patch_registry.patched(Patch("i", "method", plain("i")), leaf):
        pass  # verified: Child.method is a plain method
    prop = Patch("prop", f"{M}:Child.method", property(lambda self: "prop"))
    with patch_registry.patched(prop), pytest.raises(UnpatchableTargetError, match="data descriptor"):
        patch_registry.apply(Patch("i2", "method", plain("i")), sample.Child())
    pristine()


@pytest.mark.parametrize("planned", [False, True])
def test_strict_refuses_only_skips_that_matter(
    patch_registry: Registry, pristine: Any, caplog: pytest.LogCaptureFixture, planned: bool
) -> None:
    """strict=True (and warn=True) pass over a skip marked "not needed here"; a needed skip still refuses."""
    fixed = Patch("fixed", "method", plain("x"), when=not_needed_when(requires("attrs>=1")))
    wanted = Patch("wanted", "forward", plain("y"))
    missing = Patch("missing", "forward", plain("z"), when=check(lambda: (False, "no accelerator"), "accelerator"))
    leaf = sample.Leaf()
    fine = PatchSet("fine", [fixed, wanted])
    for _ in range(2 if planned else 1):  # a later apply of a set on an object runs the plan its first kept
        with patch_registry.patched(fine, leaf, strict=True) as report:
            assert [name for name, _reason in report.skipped] == ["fixed"]
        patch_registry.revert(patch_registry.apply(fine, leaf, warn=True))
    assert "skipped" not in caplog.text
    with pytest.raises(TargetNotFoundError, match="missing: no accelerator"):
        patch_registry.apply(PatchSet("bad", [fixed, missing]), leaf, strict=True)
    assert patch_registry.active() == ()
    assert set(vars(leaf)) == {"tag"}
    pristine()


def test_rollback_after_a_revert_by_target_and_a_dead_holder(patch_registry: Registry, pristine: Any) -> None:
    """Applies since the checkpoint already released by target, or whose object died, roll back as nothing."""
    p = Patch("p", f"{M}:Child.method", plain("p"))
    leaf = sample.Leaf()
    checkpoint = patch_registry.checkpoint()
    patch_registry.apply(p)
    patch_registry.apply(Patch("f", "forward", plain("f")), leaf)
    assert patch_registry.revert(p) == 1
    del leaf
    gc.collect()
    assert patch_registry.rollback(checkpoint) == 0
    assert patch_registry.active() == ()
    pristine()


# -- introspection and errors name what they are about ------------------------------------------


def test_explain_sees_another_registrys_install(patch_registry: Registry, pristine: Any) -> None:
    """explain() says conflict where apply() would raise one because of another registry's replace."""
    other = Registry("other")
    with other.patched(Patch("pa", f"{M}:module_func", plain("a"))):
        pb = Patch("pb", f"{M}:module_func", plain("b"))
        (row,) = patch_registry.explain(pb).rows
        assert row[2] == "conflict" and "in registry 'other'" in row[3]
        with pytest.raises(PatchConflictError):
            patch_registry.apply(pb)
        same = Patch("pa2", f"{M}:module_func", tagging_wrapper("w"), kind="wrap")
        assert patch_registry.explain(same).rows[0][2] == "install"  # a wrap stacks over it
    pristine()


def test_is_active_takes_a_patch_or_a_name(patch_registry: Registry) -> None:
    """is_active() accepts the Patch itself; anything but a name or a Patch is refused with a clear error."""
    p = Patch("f", f"{M}:module_func", plain("p"))
    twin = Patch("f", f"{M}:Base.method", plain("x"))
    with patch_registry.patched(p):
        assert patch_registry.is_active(p) and patch_registry.is_active("f")
        assert not patch_registry.is_active(twin)  # the same name, another patch
    assert not patch_registry.is_active(p)
    with pytest.raises(PatchDefinitionError, match="patch name or a Patch"):
        patch_registry.is_active(42)  # type: ignore[arg-type]


def test_rollback_refuses_what_is_not_a_checkpoint(patch_registry: Registry) -> None:
    """rollback(None) is a PatchDefinitionError naming the remedy, not an AttributeError."""
    with pytest.raises(PatchDefinitionError, match="checkpoint"):
        patch_registry.rollback(None)  # type: ignore[arg-type]


def test_any_iterable_of_patches_is_a_target(patch_registry: Registry, pristine: Any) -> None:
    """A generator of patches is applied like a list of them."""
    p = Patch("f", f"{M}:module_func", plain("p"))
    report = patch_registry.apply(x for x in [p])
    assert report.installed == 1 and sample.module_func(1) == "p"
    patch_registry.revert(report)
    pristine()


def test_errors_while_applying_name_the_patch(patch_registry: Registry) -> None:
    """A predicate or selector error carries the patch it was about; strict names the first skipped patch."""
    bad = Patch("bad", f"{M}:module_func", plain("p"), when=check(lambda: (1 / 0, "")[1], "divides"))
    with pytest.raises(PatchError) as info:
        patch_registry.apply(bad)
    assert info.value.patch is bad and info.value.target == f"{M}:module_func"
    sel = Patch("sel", "forward", plain("p"))
    with pytest.raises(UnpatchableTargetError) as info:
        patch_registry.apply(sel)  # a selector with no object
    assert info.value.patch is sel
    missing = Patch("missing", "nosuchattr", plain("p"))
    with pytest.raises(TargetNotFoundError) as info:
        patch_registry.apply(PatchSet("s", (missing,)), sample.Child(), strict=True)
    assert info.value.patch is missing and info.value.target == "nosuchattr"
    assert patch_registry.active() == ()


# -- the decorator form ---------------------------------------------------------------------------


def test_decorated_generators_and_coroutines_run_inside_the_block(patch_registry: Registry, pristine: Any) -> None:
    """@patched on a generator or coroutine function keeps the patch while its body runs, and stays that kind."""
    import asyncio
    import inspect

    deco = patch_registry.patched(Patch("f", f"{M}:module_func", plain("patched")))

    @deco
    def gen() -> Any:
        yield sample.module_func(1)
        yield sample.module_func(2)

    @deco
    async def coro() -> Any:
        await asyncio.sleep(0)
        return sample.module_func(1)

    @deco
    async def agen() -> Any:
        await asyncio.sleep(0)
        yield sample.module_func(1)

    async def collect() -> list[Any]:
        return [x async for x in agen()]

    assert inspect.isgeneratorfunction(gen) and inspect.iscoroutinefunction(coro) and inspect.isasyncgenfunction(agen)
    assert list(gen()) == ["patched", "patched"]
    assert asyncio.run(coro()) == "patched"
    assert asyncio.run(collect()) == ["patched"]
    assert gen.__name__ == "gen" and patch_registry.active() == ()
    pristine()
