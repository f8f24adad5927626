"""mtp_patched on Megatron-Core as users run it from source: the code imported decides, not the metadata.

``make test-source-trees`` runs these (with the guarantees of test_families.py, test_fixups.py, ...) on the
Megatron-LM main and dev snapshots and on the 0.18.2 and 0.19.2 wheels unpacked without their dist-info, each with
no ``megatron-core`` metadata importable, and on main over 0.19.2's installed metadata. Each test asks the imported
code what it has (a signature, a function), so the same file runs, and says what it checked, on every tree and
release: the rows of issue 41's table are the cases where the tree has the thing.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import io
from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

import patchreg
from patches.megatron import (
    CPU_SET,
    MTP_FIXUPS_SET,
    PACKED_PADDED_ROLL,
    MissingUpstreamArgumentError,
    _loss,
    cpu_patched,
    mtp_patched,
)
from patches.megatron._native import native
from tests.megatron.conftest import MCORE, build_gpt, make_batch, record_measurement
from tests.megatron.hybrid_models import build_hybrid, hybrid_skip_reason

FAMILIES = ("GPTModel", "HybridModel")
_MODEL_PATCHES = ("rl_mode_forward", "postprocess", "hybrid_forward", "mtp_heads_attached")


def build(family: str, **kwargs: Any) -> Any:
    """A tiny real GPTModel or HybridModel with MTP; the hybrid one skipped where the tree has none with MTP."""
    if family == "GPTModel":
        return build_gpt(mtp_num_layers=kwargs.pop("depth", 1), **kwargs)
    if hybrid_skip_reason() is not None:
        pytest.skip(str(hybrid_skip_reason()))
    return build_hybrid(**kwargs)


def tree_version() -> str:
    """The version the imported tree writes in its own ``megatron/core/package_info.py`` (without a VCS suffix)."""
    from megatron.core import package_info

    release = ".".join(str(part) for part in (package_info.MAJOR, package_info.MINOR, package_info.PATCH))
    return release + str(getattr(package_info, "PRE_RELEASE", "") or "")


def installed_metadata() -> str | None:
    """The version of an installed ``megatron-core`` distribution (its metadata), None when there is none."""
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("family", FAMILIES)
def test_the_report_names_the_version_of_the_code_imported(family: str) -> None:
    """str(MTPReport), the predicates' reasons and doctor name the imported tree's own version, with or without
    metadata, and with another release's metadata installed (an overlay)."""
    from patchreg._cli import run

    version = tree_version()
    assert MCORE is not None and MCORE.startswith(version), (MCORE, version)
    model = build(family)
    with mtp_patched(model) as report:
        pass
    head = str(report).splitlines()[0]
    metadata = installed_metadata()
    assert f"megatron-core {version}" in head, head
    if metadata is None:  # a tree without metadata: its own files answer
        assert f"megatron-core {version} (source)" in head, head
    elif metadata != version:  # main over 0.19.2's metadata: the tree answers, the overlaid release is named
        assert f"megatron-core {version} (source, over {metadata})" in head, head
    record_measurement(f"imported version ({family})", {"tree": version, "metadata": metadata})  # type: ignore[arg-type]
    reason = patchreg.requires("megatron-core>=0.13").evaluate().reason
    assert f"megatron-core {version}" in reason, reason
    out = io.StringIO()
    run(["doctor", "megatron-mtp-fixups"], out=out)
    assert f"megatron-core {version}" in out.getvalue().splitlines()[0]


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_block_installs_its_route_and_returns_logits(family: str, detach: bool) -> None:
    """With the tree's own version (no metadata needed) the block installs a route and the model returns logits and
    an MTP loss, never the LM loss (the 0.18.2 row: before, nothing installed and the model returned a loss)."""
    model, batch = build(family), make_batch()
    with mtp_patched(model, detach_encoder=detach) as report:
        out = model(*batch.args(), **batch.kwargs())
    assert report.installed > 0, str(report)
    assert out.shape == (2, 8, 64) and len(report.mtp_losses) == 1
    route = "native" if native() else "today's patches"
    installed = sorted({e.patch for e in report.entries})
    record_measurement(f"route ({family}, detach={detach})", {"route": route, "installed": installed})  # type: ignore[arg-type]


def _inference_check() -> bool:
    from megatron.core.transformer import multi_token_prediction

    return hasattr(multi_token_prediction, "is_inference_column_parallel_linear")


@pytest.mark.no_cpu_shims
@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_patched_builds_the_mtp_layer_past_the_inference_linear_check(family: str) -> None:
    """main: without Transformer Engine the MTP layer's is_inference_column_parallel_linear raises TypeError (an
    isinstance against TE stand-ins); cpu_patched's inference_linear_on_cpu builds it. Elsewhere: not needed here."""
    with cpu_patched() as report:
        skipped = dict(report.skipped)
    if not _inference_check():
        assert "not needed here" in skipped["inference_linear_on_cpu"]
        pytest.skip(f"megatron-core {MCORE}: the MTP layer calls no is_inference_column_parallel_linear")
    if "inference_linear_on_cpu" in skipped:  # Transformer Engine is installed: upstream's check runs
        assert "Transformer Engine is installed" in skipped["inference_linear_on_cpu"]
        return
    with (
        patchreg.registry.patched(CPU_SET.without("inference_linear_on_cpu")),
        pytest.raises(TypeError, match="isinstance"),
    ):
        build(family)
    with cpu_patched() as report:
        model = build(family)
        assert "inference_linear_on_cpu" in {e.patch for e in report.entries}
        batch = make_batch()
        with mtp_patched(model) as block:
            assert model(*batch.args(), **batch.kwargs()).shape == (2, 8, 64)
    assert len(block.mtp_losses) == 1


def test_compute_mtp_loss_passes_through_the_block() -> None:
    """main: HybridModel.forward(..., compute_mtp_loss=False) inside the block returns the same logits and computes
    no MTP loss (the MTP layers get no gradient); True is the default."""
    hybrid = build("HybridModel")
    if "compute_mtp_loss" not in inspect.signature(type(hybrid).forward).parameters:
        pytest.skip(f"megatron-core {MCORE}: HybridModel.forward takes no compute_mtp_loss")
    batch = make_batch()
    results = {}
    for flag in (True, False):
        hybrid.zero_grad(set_to_none=True)
        with mtp_patched(hybrid) as report:
            logits = hybrid(*batch.args(), **batch.kwargs(), compute_mtp_loss=flag)
            (logits * 0).sum().backward()
        grads = [p.grad for n, p in hybrid.named_parameters() if n.startswith("mtp.")]
        results[flag] = (logits.detach(), report.mtp_losses, any(g is not None and g.count_nonzero() for g in grads))
    assert torch.equal(results[True][0], results[False][0])
    assert len(results[True][1]) == 1 and results[True][2]
    assert results[False][1] == () and not results[False][2]


@pytest.mark.no_distributed
def test_return_sum_passes_through_the_padded_roll_fixup() -> None:
    """main: roll_tensor(..., return_sum=False) (the MTP hidden-state mixing's call) keeps its meaning under the
    packed_padded_roll wrap: the padded roll, and no sum."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer import multi_token_prediction as mtp

    from patches.megatron._fixups import PROBE_PACK

    if "return_sum" not in inspect.signature(mtp.roll_tensor).parameters:
        pytest.skip(f"megatron-core {MCORE}: roll_tensor takes no return_sum")
    if not PACKED_PADDED_ROLL.when.evaluate().ok:
        pytest.skip(f"packed_padded_roll does not install here: {PACKED_PADDED_ROLL.when.evaluate().reason}")
    cu, padded, want = (torch.tensor(v, dtype=torch.int32) for v in PROBE_PACK)
    pack = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
                           cu_seqlens_kv_padded=padded, max_seqlen_q=8, max_seqlen_kv=8)  # fmt: skip
    tensor = torch.arange(1, 17, dtype=torch.int32)[None]
    with patchreg.Registry("fixups").patched(MTP_FIXUPS_SET):
        rolled, total = mtp.roll_tensor(tensor, -1, -1, None, pack, return_sum=False)
        _, with_sum = mtp.roll_tensor(tensor, packed_seq_params=pack)
    assert torch.equal(rolled[0], want) and total is None and int(with_sum) == int(want.sum())


def _recording(monkeypatch: Any, name: str) -> list[dict[str, Any]]:
    """Record the arguments of every call of the MTP module's ``name`` (upstream's own function runs)."""
    import functools

    from megatron.core.transformer import multi_token_prediction as mtp

    real, calls = getattr(mtp, name), []

    @functools.wraps(real)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append(inspect.signature(real).bind(*args, **kwargs).arguments)
        return real(*args, **kwargs)

    monkeypatch.setattr(mtp, name, recorded)
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_the_list_roll_and_the_roll_context_are_used(family: str, todays_route: None, monkeypatch: Any) -> None:
    """dev: the patches' own MTP loss rolls labels and mask in one list call (fill values 0, upstream's field names,
    the depth), and upstream's process_mtp_loss gets the model's sequence_roll_context on the native route."""
    from megatron.core.transformer import multi_token_prediction as mtp

    if _loss.roll_form(mtp.roll_tensor) != "tensors":
        pytest.skip(f"megatron-core {MCORE}: roll_tensor rolls one tensor (roll_tensor(tensor, ...))")
    calls = _recording(monkeypatch, "roll_tensor")
    model, batch = build(family, depth=2), make_batch()
    with mtp_patched(model) as report:
        model(*batch.args(), **batch.kwargs())
    ours = [c for c in calls if "sequence_fields" not in c]  # upstream's own rolls name their fields
    assert [c["roll_depth"] for c in ours[-2:]] == [0, 1], calls
    assert len(report.mtp_losses) == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_process_mtp_loss_gets_the_sequence_roll_context_on_the_native_route(family: str) -> None:
    """dev: the model's sequence_roll_context reaches upstream's process_mtp_loss through the native route's wrap."""
    from megatron.core.transformer import multi_token_prediction as mtp

    process = getattr(mtp, "process_mtp_loss", None)  # 0.17+
    if process is None or "sequence_roll_context" not in inspect.signature(process).parameters:
        pytest.skip(f"megatron-core {MCORE}: process_mtp_loss takes no sequence_roll_context")
    assert native(), "dev has upstream's RL mode with mtp_detach_heads: the native route"
    model, batch = build(family), make_batch()
    module = inspect.getmodule(type(model))
    with pytest.MonkeyPatch.context() as mp:
        calls = _recording_in(mp, module, "process_mtp_loss")
        with mtp_patched(model) as report:
            model(*batch.args(), **batch.kwargs())
    assert calls and "sequence_roll_context" in calls[-1] and len(report.mtp_losses) == 1


def _recording_in(mp: pytest.MonkeyPatch, module: Any, name: str) -> list[dict[str, Any]]:
    """Record the keyword arguments of the calls of ``module.name`` (upstream's function, under any wrap, runs)."""
    real, calls = getattr(module, name), []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append(dict(kwargs))
        return real(*args, **kwargs)

    recorded.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]
    recorded.__wrapped__ = getattr(real, "__wrapped__", real)  # type: ignore[attr-defined]
    mp.setattr(module, name, recorded)
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_an_upstream_form_the_patches_cannot_call_is_refused_at_entry(family: str, monkeypatch: Any) -> None:
    """A roll_tensor in neither form the patches call refuses the block at its entry, naming the release, the
    function and the remedy; nothing is installed and no forward runs (as the patches' knowledge of the tree's own
    form is taken away here); with it back, the block runs."""
    from megatron.core.transformer import multi_token_prediction as mtp

    model, batch = build(family), make_batch()
    form = _loss.roll_form(mtp.roll_tensor)
    assert form in _loss.ROLL_FORMS
    before = dict(vars(model))
    monkeypatch.setattr(_loss, "ROLL_FORMS", tuple(f for f in _loss.ROLL_FORMS if f != form))
    patchreg.refresh()
    ran: list[bool] = []
    model.register_forward_pre_hook(lambda *_: ran.append(True))
    try:
        with pytest.raises(MissingUpstreamArgumentError) as caught, mtp_patched(model):
            model(*batch.args(), **batch.kwargs())
    finally:
        monkeypatch.undo()
        patchreg.refresh()
    text = str(caught.value)
    assert f"megatron-core {MCORE}" in text and "roll_tensor(" in text and "pin a supported megatron-core" in text
    assert "Nothing was installed, and no forward ran" in text
    assert ran == [] and not any(patchreg.registry.is_active(name, model) for name in _MODEL_PATCHES)
    assert vars(model).keys() == before.keys() and all(vars(model)[k] is v for k, v in before.items())
    with mtp_patched(model) as report:
        assert model(*batch.args(), **batch.kwargs()).shape == (2, 8, 64)
    assert len(report.mtp_losses) == 1


@pytest.mark.parametrize(
    ("where", "names", "callee"),
    [
        ("patches.megatron._postprocess", "_BLOCK_INPUTS", "MultiTokenPredictionBlock.forward"),
        ("patches.megatron._loss", "_TRACKED_WITH_COUNTS", "MTPLossLoggingHelper.save_metrics_to_tracker"),
        ("patches.megatron._loss", "_TRACKED", "MTPLossLoggingHelper.save_loss_to_tracker"),
    ],
    ids=["mtp-block", "tracker-0.19", "tracker"],
)
def test_a_callee_requiring_what_todays_patches_do_not_pass_is_refused_at_entry(
    where: str, names: str, callee: str, todays_route: None, monkeypatch: Any
) -> None:
    """On today's route, an upstream callee (the MTP block's forward, the tracker's helper) requiring an argument the
    patches do not pass refuses the GPTModel block at its entry, naming it: never MissingUpstreamArgumentError in the
    middle of the first forward (as the patches' list of what they pass is cut here)."""
    import importlib

    from megatron.core.transformer import multi_token_prediction as mtp

    owner, attr = callee.split(".")
    function = getattr(getattr(mtp, owner, None), attr, None)
    layer_inputs = inspect.signature(mtp.MultiTokenPredictionLayer.forward).parameters
    if (
        function is None
        or (names == "_TRACKED" and hasattr(mtp.MTPLossLoggingHelper, "save_metrics_to_tracker"))
        or (names == "_BLOCK_INPUTS" and "decoder_input" in layer_inputs)  # 0.13: the patches drive the layers
    ):
        pytest.skip(f"megatron-core {MCORE}: today's patches call no {callee} here")
    required = [n for n, p in inspect.signature(function).parameters.items() if p.default is p.empty and n != "self"]
    module = importlib.import_module(where)
    monkeypatch.setattr(module, names, getattr(module, names) - {required[0]})
    patchreg.refresh()
    model, batch = build("GPTModel"), make_batch()
    ran: list[bool] = []
    model.register_forward_pre_hook(lambda *_: ran.append(True))
    with (
        pytest.raises(MissingUpstreamArgumentError, match=rf"{callee}\(.*requires '{required[0]}'"),
        mtp_patched(model),
    ):
        model(*batch.args(), **batch.kwargs())
    assert ran == [] and "_postprocess" not in vars(model)
