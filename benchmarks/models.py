"""Measurements on a tiny real Megatron-Core GPTModel: 2 (scaling), 5 (training step), 6 (hygiene); the predicates of section 4."""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import weakref
from collections.abc import Callable
from typing import Any

import patchreg
from benchmarks import _model
from benchmarks._peers import PeerUnavailable, load_verl
from benchmarks._report import Check, Section
from benchmarks._settings import Settings
from benchmarks._sides import (
    _apply_revert,
    _patchreg_cycle,
    _quiet_stdout,
    _verl_cycle,
    ours,
)
from benchmarks._timing import compare, looped


def mtp_predicates() -> tuple[list[patchreg.Predicate], str]:
    """The predicates of the MTP set (detach_encoder=True), for section 4."""
    mtp = ours()
    preds = [p.when for p in mtp.MTP_DETACH_SET]
    return (
        preds,
        f"the {len(preds)} `when=` predicates of `{mtp.MTP_DETACH_SET.name}` (what `mtp_patched(model, detach_encoder=True)` evaluates)",
    )


# -- 2. scaling ----------------------------------------------------------------------------


def scaling(settings: Settings) -> Section:
    """Section 2: enter + exit of mtp_patched on GPTModels with 1 to 512 MTP layers; nn.Module trees beside."""
    from benchmarks import engine

    mtp = ours()
    cycles: dict[int, tuple[Callable[[], object], int]] = {}
    engine_cycles: dict[int, tuple[Callable[[], object], int]] = {}
    for n in engine.SIZES:
        model = _model.build(n)
        with patchreg.Registry("bench-probe").patched(mtp.MTP_DETACH_SET, model) as report:
            targets = report.installed
        cycles[n] = (_patchreg_cycle(model), targets)
        engine_cycles[n] = (_apply_revert(model), targets)
    rows, spread, flat = engine.per_target("GPTModel, `mtp_patched` enter + exit", cycles, settings)
    engine_rows, engine_spread, _flat = engine.per_target("GPTModel, engine apply + revert", engine_cycles, settings)
    tree_rows, tree_spread, tree_flat = engine.tree_scaling(settings)
    if math.isnan(flat):  # the block installs as many targets at every size (0.19.2's native route): the engine's
        further = Check(  # cost per further target is then read on the nn.Module trees, and the block's on its cycle
            "cost per further target, max/min over 8..512 leaves (nn.Module trees; the block's targets do not grow "
            f"with its MTP layers: its cycle max/min over 1..512 MTP layers is {spread:.2f}x) (issue 17)",
            f"{tree_flat:.2f}x",
            "<= 1.5x",
            tree_flat <= 1.5 and spread <= 1.5,
        )
    else:
        further = Check(
            "cost per further target, max/min over 8..512 MTP layers (issue 17)", f"{flat:.2f}x", "<= 1.5x", flat <= 1.5
        )
    return Section(
        2,
        "Scaling: apply + revert over 1 to 512 MTP layers",
        ("series", "MTP layers / leaves", "targets installed", "per cycle", "per target", "per further target"),
        rows + engine_rows + tree_rows,
        [
            further,
            Check("per-target cost, max/min over 1..512 MTP layers (information)", f"{spread:.2f}x", "-", None),
        ],
        [
            "GPTModel series: real models with `mtp_num_layers` = 1, 8, 64, 512; targets = the model's "
            "`_postprocess` plus each MTP layer's patched methods (what the report says was installed). The "
            "target is checked on this series. The sizes of a series are timed interleaved (the order rotates "
            "every repetition), so a change in the machine's load hits every size alike.",
            f"Engine series (not the checked one): `registry.revert(registry.apply(MTP_DETACH_SET, model))` on the "
            f"same models, without the `with` statement and `mtp_patched`'s own work; spread {engine_spread:.2f}x.",
            f"nn.Module tree series (no target, for the engine alone): one selector patch "
            f"`mtp.layers[*]._get_embeddings` on trees of N leaves; spread {tree_spread:.2f}x. With one target "
            "per apply, the fixed cost of an apply (plan lookup, guards, report, lock) is not shared by any other target.",
            "Per further target: (cycle - cycle of the smallest size) / (targets - its targets), the cost each "
            "target adds once the block's fixed cost (the `with` statement, `mtp_patched`'s report, the plan's "
            "guards, the lock) is paid; flat means no target makes the others dearer. The checked per-target "
            "figure includes that fixed cost, so it falls as the block grows.",
        ],
    )


# -- 6. memory hygiene ----------------------------------------------------------------------


def _alive_after(n: int, cycle: Callable[[Any], None] | None) -> int:
    """With gc disabled: build, patch, revert and drop ``n`` models; how many are still alive."""
    refs = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            model = _model.build()
            if cycle is not None:
                cycle(model)
            refs.append(weakref.ref(model))
            del model
        alive = sum(ref() is not None for ref in refs)
    finally:
        gc.enable()
        gc.collect()
    return alive


def hygiene(settings: Settings) -> Section:
    """Section 6: models left alive (with gc off) after patch + revert + drop."""
    mtp = ours()
    n = settings.hygiene_models

    def ours_cycle(model: Any) -> None:
        with mtp.mtp_patched(model, detach_encoder=True) as report:
            assert report.installed > 0, "mtp_patched installed nothing"

    section = Section(
        6,
        f"Memory hygiene: {n} models built, patched, reverted and dropped with gc disabled",
        ("side", "models still alive"),
    )
    baseline = _alive_after(n, None)
    alive = _alive_after(n, ours_cycle)
    section.rows += [("no patch (baseline)", str(baseline)), ("patchreg mtp_patched", str(alive))]
    try:
        verl, _ = load_verl()
    except PeerUnavailable as exc:
        section.rows.append(("verl 0.9.1", f"not measured: {exc}"))
    else:
        with _quiet_stdout():
            verl_alive = _alive_after(n, lambda m: _verl_cycle(verl, m)())
        section.rows.append(("verl 0.9.1 patch+unpatch", str(verl_alive)))
    section.checks.append(Check("models alive after revert + drop (gc off)", f"{alive} of {n}", "0", alive == 0))
    section.notes = [
        "Alive = a weak reference to the model still resolves after the last strong reference is dropped, "
        "with the cyclic garbage collector disabled; only reference cycles keep a dropped model alive.",
        "verl's unpatch leaves `_postprocess` (a bound method of the model) and `_postprocess_backup` in the "
        "model's `__dict__`: a reference cycle, so each model waits for the cyclic collector.",
    ]
    return section


# -- 5. training step -----------------------------------------------------------------------


def first_use_ns() -> float:
    """The first evaluation of the MTP set's predicates in a fresh interpreter, in ns (section 4)."""
    return float(_worker("predicates")["first_predicates_ns"])


def _rss(side: str, steps: int) -> dict[str, Any]:
    """Run one side's steps in a fresh interpreter; its peak RSS and median step time."""
    return _worker(side, str(steps))


def _worker(*args: str) -> dict[str, Any]:
    """Run ``python -m benchmarks._worker ARGS`` in a fresh interpreter; the JSON it prints last."""
    side = args[0]
    cmd = [sys.executable, "-m", "benchmarks._worker", *args]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}  # a port of its own
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        msg = f"the {side} worker failed (exit {done.returncode}): {tail}"
        raise RuntimeError(msg)
    result: dict[str, Any] = json.loads(lines[-1])
    return result


NO_ROUTE = "today's patches (this release has no native route)"
UPSTREAM_BY_HAND = "upstream's RL mode by hand, no patch (mtp_detach_heads set once, labels=None)"


def _native_route(model: Any) -> bool:
    """Whether this release takes the native route: the block would install upstream's RL-mode forward on ``model``
    (asked through the public ``explain``, which changes nothing)."""
    rows = patchreg.registry.explain(ours().MTP_DETACH_SET, model).rows
    return any(patch == "rl_mode_forward" and would == "install" for patch, _holder, would, _why in rows)


def training_step(settings: Settings) -> Section:
    """Section 5: forward + backward inside mtp_patched vs with verl's patches; then peak RSS per side."""
    from benchmarks import _step

    section = Section(
        5, "Training step (forward + backward, `detach_encoder=True`)", ("side", "step", "÷ verl patched once")
    )
    try:
        verl, _ = load_verl()
    except PeerUnavailable as exc:
        section.notes.append(f"verl could not be measured: {exc}.")
        section.checks.append(Check("training step vs verl", "-", "<= 1.02x", None))
        return section
    ours_model, batch = _step.model_and_batch()
    once_model, _ = _step.model_and_batch()
    verl_model, _ = _step.model_and_batch()
    verl_every_model, _ = _step.model_and_batch()
    control_model, _ = _step.model_and_batch()
    native_model, _ = _step.model_and_batch()
    native = _native_route(native_model)
    if native:
        native_model.config.mtp_detach_heads = True
    ours_name, once_name, verl_name, verl_every_name, control_name = (
        "patchreg, mtp_patched entered every step",
        "patchreg, mtp_patched entered once",
        "verl 0.9.1, patched once",
        "verl 0.9.1, patched and unpatched every step",
        "verl 0.9.1, patched once, on a second model (A/A control)",
    )
    mtp = ours()
    with (
        _step.cpu_block(),
        _step.verl_applied(verl, verl_model),
        _step.verl_applied(verl, control_model),
        mtp.mtp_patched(once_model, detach_encoder=True),
    ):
        with mtp.mtp_patched(ours_model, detach_encoder=True) as report:
            _step.forward_backward(ours_model, batch)
            route = getattr(report, "last_route", None)
        variants = {
            ours_name: looped(_step.ours_step(ours_model, batch)),
            once_name: looped(_step.verl_step(once_model, batch)),
            verl_name: looped(_step.verl_step(verl_model, batch)),
            verl_every_name: looped(_step.verl_every_step(verl, verl_every_model, batch)),
            control_name: looped(_step.verl_step(control_model, batch)),
        }
        if native:
            variants[UPSTREAM_BY_HAND] = looped(_step.upstream_rl_mode_step(native_model, batch))
        cmp = compare(variants, number=1, repeat=settings.steps, warmup=2)
    control = cmp.ratio(control_name, verl_name).median
    ms = lambda s: f"{s.median / 1e6:.2f} ms ({s.min / 1e6:.2f}-{s.max / 1e6:.2f})"  # noqa: E731
    for name in variants:
        r = cmp.ratio(name, verl_name)
        section.rows.append(
            (name, ms(cmp.stats[name]), "-" if name == verl_name else f"{r.median:.3f}x ({r.min:.3f}-{r.max:.3f})")
        )
    for name, peer, label in (
        (ours_name, verl_name, "ours entered every step, verl patched once"),
        (once_name, verl_name, "both patched once"),
        (ours_name, verl_every_name, "both every step"),
    ):
        r = cmp.ratio(name, peer).median
        section.checks.append(Check(f"training step vs verl, {label}", f"{r:.3f}x", "<= 1.02x", r <= 1.02))
    if native:
        for name, label in ((ours_name, "ours entered every step"), (once_name, "ours entered once")):
            r = cmp.ratio(name, UPSTREAM_BY_HAND).median
            section.checks.append(
                Check(f"training step vs upstream's RL mode by hand, {label} (information)", f"{r:.3f}x", "-", None)
            )
    try:
        ours_rss = _rss("patchreg", settings.rss_steps)
        verl_rss = _rss("verl", settings.rss_steps)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        section.notes.append(f"Peak RSS not measured: {exc}.")
        section.checks.append(Check("peak RSS vs verl", "-", "not higher", None))
    else:
        a, b = ours_rss["peak_rss_kib"], verl_rss["peak_rss_kib"]
        section.rows += [
            ("peak RSS of the process, patchreg", f"{a / 1024:.1f} MiB ({a} KiB)", f"{a / b:.4f}x"),
            ("peak RSS of the process, verl", f"{b / 1024:.1f} MiB ({b} KiB)", "-"),
        ]
        section.checks.append(
            Check("peak RSS vs verl (own process each)", f"{a / 1024:.1f} vs {b / 1024:.1f} MiB", "not higher", a <= b)
        )
        sa, sb = ours_rss.get("steps_peak_kib"), verl_rss.get("steps_peak_kib")
        if sa and sb:
            ga, gb = sa - ours_rss["rss_before_steps_kib"], sb - verl_rss["rss_before_steps_kib"]
            section.rows += [
                (
                    "peak RSS during the steps, patchreg",
                    f"{sa / 1024:.1f} MiB (+{ga / 1024:.1f} over before)",
                    f"{sa / sb:.4f}x",
                ),
                ("peak RSS during the steps, verl", f"{sb / 1024:.1f} MiB (+{gb / 1024:.1f} over before)", "-"),
            ]
            section.checks.append(
                Check(
                    "RSS growth during the steps vs verl",
                    f"+{ga / 1024:.1f} vs +{gb / 1024:.1f} MiB",
                    "not higher (within 1 MiB)",
                    ga <= gb + 1024,
                )
            )
    section.notes += [
        "Both models are built with the same seed and configuration, dropout off, and run under the CPU shims "
        "(`cpu_patched()`); the loss is cross-entropy on the returned logits, the MTP loss rides on the graph.",
        "verl's patches are applied once for the whole run; our side is measured both ways: `mtp_patched` "
        "entered and exited around every step (as an RL loop does) and entered once; verl is also measured "
        "patched and unpatched around every step, for the like-for-like per-step ratio. Re-patching every step "
        "costs either tool more than its patch cycle (the interpreter's attribute caches for the patched objects "
        "are invalidated when their `__dict__` changes, a likely cause). The variants alternate "
        f"step by step ({settings.steps} steps each); the ratio is the median of the per-step ratios. "
        "torch runs one intra-op thread on every side.",
        f"A/A control: verl patched once on a second model, timed as a side of its own; its ratio to the first "
        f"({control:.3f}x in this run) is how far two identical sides land apart here, so a ratio within that "
        "distance of its bound is not decided by one run.",
        "The batch is an RL actor's (verl's Megatron actor): the labels are the ids shifted left once and the loss "
        "mask is 0 at the last position, whose label the shift wraps around. Our block's MTP loss took this route "
        f"here: {route or NO_ROUTE} (`report.last_route`; on megatron-core 0.19.2 upstream's "
        "own forward and MTP loss, on the user's labels).",
        f"On releases with upstream's RL mode, the side '{UPSTREAM_BY_HAND}' is what a user of upstream's own "
        "feature writes without us: the flag set on the config once, `labels=None`, the loss mask shifted right. "
        "Ours over it is the price of the block (the install and release of its three patches, the user's labels "
        "carried to the MTP loss, the per-depth losses kept for `report.mtp_losses`), a constant per forward.",
        "Not quite equal work: with `detach_encoder=True` our MTP logits use a detached output-layer weight (the "
        "MTP loss does not train the output layer, the same on every release), while verl's 0.17+ path passes "
        "the live weight; our backward skips one weight-gradient product per MTP depth (vocabulary 64 here, so "
        "it does not show).",
        f"Peak RSS: each side in its own fresh `python -m benchmarks._worker` process ({settings.rss_steps} steps, "
        "`ru_maxrss`), so one side's allocations cannot raise the other's peak. That peak is set by importing "
        "torch and Megatron-Core, so the kernel's peak mark is also reset (`/proc/self/clear_refs` = 5) just "
        "before the steps and read back after them (`VmHWM`): the peak of the steps themselves.",
    ]
    return section
