"""The fix-up of upstream MTP on padded packed sequences (``packed_padded_roll``), on real tiny models.

Two sequences of 5 and 6 tokens, each padded to 8, packed as ``thd`` with ``cu_seqlens_q_padded`` (as
verl and Megatron's own data path build them), against the same two sequences as a ``bshd`` batch of two
rows: with the fix-up the per-depth MTP losses and the gradients agree within 1e-6; without it (switched off in
mtp_patched, or upstream's own MTP) they do not, wherever the probe says upstream is wrong.
The figures with and without the fix-up go to $PATCHREG_MEASUREMENTS (``packed-padded ...`` keys).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

import patchreg
from patches.megatron import MTP_FIXUPS_SET, PACKED_PADDED_ROLL, _fixups, mtp_patched
from patches.megatron._loss import tracked_losses
from tests.megatron.conftest import MCORE, VOCAB, build_gpt, record_measurement
from tests.megatron.hybrid_models import build_hybrid, hybrid_skip_reason

LENGTHS, PADDED = (5, 6), 8
PAD = VOCAB - 1  # the pad slots hold a real token id: a roll that mixes them in shows
TOLERANCE = 1e-6
FAMILIES = ("GPTModel", "HybridModel")


def build(family: str, depth: int, tied: bool = False) -> Any:
    """A tiny real GPTModel or HybridModel (MambaModel 0.17) with ``depth`` MTP depths; skipped where absent."""
    if family == "GPTModel":
        return build_gpt(tied=tied, mtp_num_layers=depth)
    reason = hybrid_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return build_hybrid(tied=tied, depth=depth)


def _needed() -> None:
    """Skip where the fix-up does not install: no packed MTP roll, or upstream already rolls on padded boundaries."""
    answer = PACKED_PADDED_ROLL.when.evaluate()
    if not answer.ok:
        pytest.skip(f"packed_padded_roll does not install on megatron-core {MCORE}: {answer.reason}")


def _packed_roll() -> None:
    """Skip where upstream's MTP has no packed roll (before 0.16): there is no padded pack to get right."""
    from patches.megatron._fixups import _no_packed_roll

    none, reason = _no_packed_roll()
    if none:
        pytest.skip(f"megatron-core {MCORE}: {reason}")


def bshd_batch(seed: int = 3) -> dict[str, Any]:
    """The two sequences as two rows of 8 (pads at the end), label-aligned mask: 1 where the next token is real."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((2, PADDED), PAD)
    mask = torch.zeros(2, PADDED)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = torch.randint(0, VOCAB - 1, (length,), generator=gen)
        mask[row, : length - 1] = 1
    mask[0, 0] = 0  # a masked prompt token
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = 0
    pos = torch.arange(PADDED).expand(2, PADDED).contiguous()
    causal = torch.triu(torch.ones(PADDED, PADDED, dtype=torch.bool), diagonal=1)[None, None]
    return {"input_ids": ids, "position_ids": pos, "attention_mask": causal, "labels": labels, "loss_mask": mask}


def packed_batch(bshd: dict[str, Any]) -> dict[str, Any]:
    """The same rows packed into one ``thd`` sequence of 16, each sequence padded to 8 (``cu_seqlens_q_padded``)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor([0, LENGTHS[0], sum(LENGTHS)], dtype=torch.int32)
    padded = torch.tensor([0, PADDED, 2 * PADDED], dtype=torch.int32)
    pack = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
                           cu_seqlens_kv_padded=padded, max_seqlen_q=PADDED, max_seqlen_kv=PADDED)  # fmt: skip
    flat = {name: bshd[name].reshape(1, -1) for name in ("input_ids", "position_ids", "labels", "loss_mask")}
    return {**flat, "attention_mask": None, "packed_seq_params": pack}


def _step(model: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """One forward and a backward of the MTP loss alone (main output x0): (output, every parameter's gradient)."""
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    (out * 0).sum().backward()
    return out, {
        n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
    }


def _patched(model: Any, batch: dict[str, Any], detach: bool, fixup: bool) -> tuple[Any, tuple[float, ...], Any]:
    """Logits, per-depth MTP losses and gradients of one step in ``mtp_patched`` (``fixup=False``: with the fix-up
    switched off, as on a release where it is not needed)."""
    with pytest.MonkeyPatch.context() as mp:
        if not fixup:
            mp.setattr(_fixups, "needed", lambda: False)
        with mtp_patched(model, detach_encoder=detach) as report:
            logits, grads = _step(model, batch)
    return logits, report.mtp_losses, grads


def _diffs(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any], lengths: bool = True) -> tuple[float, float, float]:
    """(max per-depth loss diff, max MTP grad diff, max trunk grad diff) between two steps."""
    loss = max(abs(x - y) for x, y in zip(a[1], b[1], strict=True))
    mtp = max(float((a[2][n] - b[2][n]).abs().max()) for n in a[2] if n.startswith("mtp."))
    trunk = max(float((a[2][n] - b[2][n]).abs().max()) for n in a[2] if not n.startswith("mtp."))
    return loss, mtp, trunk


def _valid_logits(logits: Any) -> Any:
    """The packed logits ``[1, 16, v]`` at the real tokens, as ``[2, 8, v]`` rows with pads zeroed."""
    rows = logits.reshape(2, PADDED, -1).clone()
    for row, length in enumerate(LENGTHS):
        rows[row, length:] = 0
    return rows


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_padded_equals_per_sequence_bshd(family: str, depth: int, tied: bool, detach: bool) -> None:
    """In mtp_patched a padded pack gives the per-depth MTP losses and gradients of the same sequences as bshd rows
    (fixed up where upstream rolls it wrong, upstream's own roll where the probe finds it right)."""
    _packed_roll()
    model = build(family, depth, tied)
    bshd = bshd_batch()
    want = _patched(model, bshd, detach, fixup=True)
    got = _patched(model, packed_batch(bshd), detach, fixup=True)
    loss, mtp, trunk = _diffs(got, want)
    key = f"({family}, depth={depth}, tied={tied}, detach={detach})"
    record_measurement(f"packed-padded fixed loss {key}", loss)
    record_measurement(f"packed-padded fixed mtp grad {key}", mtp)
    assert len(got[1]) == depth
    assert loss <= TOLERANCE and mtp <= TOLERANCE and trunk <= TOLERANCE, (loss, mtp, trunk)
    expected = want[0].clone()
    for row, length in enumerate(LENGTHS):
        expected[row, length:] = 0
    torch.testing.assert_close(_valid_logits(got[0]), expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("family", FAMILIES)
def test_without_the_fixup_the_packed_padded_mtp_loss_is_wrong(family: str, depth: int, detach: bool) -> None:
    """mtp_patched with the fix-up switched off gives a padded pack wrong MTP losses and gradients (upstream's roll)."""
    _needed()
    model = build(family, depth)
    bshd = bshd_batch()
    want = _patched(model, bshd, detach, fixup=True)
    got = _patched(model, packed_batch(bshd), detach, fixup=False)
    loss, mtp, _trunk = _diffs(got, want)
    largest = max(float(g.abs().max()) for n, g in want[2].items() if n.startswith("mtp."))
    key = f"({family}, depth={depth}, detach={detach})"
    record_measurement(f"packed-padded unfixed loss {key}", loss)
    record_measurement(f"packed-padded unfixed mtp grad {key}", mtp)
    record_measurement(f"packed-padded largest mtp grad {key}", largest)
    assert loss > 1e-3 and mtp > 1e-3, (loss, mtp)


def _tracker_losses(depth: int) -> tuple[float, ...]:
    """The per-depth losses upstream logged to its MTP tracker."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    values = tracked_losses(MTPLossLoggingHelper.tracker)
    assert values is not None and len(values) == depth
    return tuple(float(v) for v in values)


def _upstream(model: Any, batch: dict[str, Any], fixup: bool, depth: int) -> tuple[Any, tuple[float, ...], Any]:
    """Upstream's own MTP (labels given: it returns the LM loss) with or without MTP_FIXUPS_SET applied."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()
    if fixup:
        with patchreg.Registry("fixups").patched(MTP_FIXUPS_SET) as report:
            assert "packed_padded_roll" in {e.patch for e in report.entries}
            out, grads = _step(model, batch)
    else:
        out, grads = _step(model, batch)
    return out, _tracker_losses(depth), grads


@pytest.mark.parametrize("depth", [1, 2])
def test_the_standalone_set_fixes_upstreams_own_mtp(depth: int) -> None:
    """MTP_FIXUPS_SET alone makes upstream's own MTP on a padded pack equal the bshd rows; without it, it is wrong."""
    _needed()
    model = build_gpt(mtp_num_layers=depth)
    bshd = bshd_batch()
    want = _upstream(model, bshd, fixup=False, depth=depth)
    fixed = _upstream(model, packed_batch(bshd), fixup=True, depth=depth)
    broken = _upstream(model, packed_batch(bshd), fixup=False, depth=depth)
    loss, mtp, trunk = _diffs(fixed, want)
    assert loss <= TOLERANCE and mtp <= TOLERANCE and trunk <= TOLERANCE, (loss, mtp, trunk)
    loss_broken, mtp_broken, _ = _diffs(broken, want)
    record_measurement(f"packed-padded upstream unfixed loss (depth={depth})", loss_broken)
    record_measurement(f"packed-padded upstream unfixed mtp grad (depth={depth})", mtp_broken)
    assert loss_broken > 1e-3 and mtp_broken > 1e-3, (loss_broken, mtp_broken)


@pytest.mark.parametrize("depth", [1, 2])
def test_the_fixup_applies_exactly_where_upstreams_own_mtp_is_wrong_on_a_padded_pack(depth: int) -> None:
    """The probe, not the version, decides: where upstream's own MTP on a padded pack equals the bshd rows (dev rolls
    on the padded boundaries) packed_padded_roll says "not needed here" and the block does not apply it; where it
    does not (0.16.1-0.19.2, main), the fix-up applies."""
    _packed_roll()
    model = build_gpt(mtp_num_layers=depth)
    bshd = bshd_batch()
    want = _upstream(model, bshd, fixup=False, depth=depth)
    got = _upstream(model, packed_batch(bshd), fixup=False, depth=depth)
    upstream_exact = max(_diffs(got, want)) <= TOLERANCE
    record_measurement(f"packed-padded upstream alone loss (depth={depth})", _diffs(got, want)[0])
    answer = PACKED_PADDED_ROLL.when.evaluate()
    assert answer.ok is not upstream_exact, answer.reason
    with mtp_patched(model) as report:
        pass
    text = " ".join(str(report).split())
    if upstream_exact:
        assert (
            "fix-up packed_padded_roll: not applied: not needed here: roll_tensor rolls a padded pack on its "
            "padded boundaries" in text
        ), text
    else:
        assert "fix-up packed_padded_roll: applied around each forward given a padded pack" in text, text


@pytest.mark.no_distributed
def test_the_probe_answers_on_upstreams_own_roll_while_the_fixup_is_installed() -> None:
    """The probe reads upstream's roll under the installed wrap: it answers 'needed' inside the set's block too."""
    from patches.megatron._fixups import padded_roll_is_right

    _needed()
    before = padded_roll_is_right()
    with patchreg.Registry("fixups").patched(MTP_FIXUPS_SET):
        inside = padded_roll_is_right()
    assert before == inside and before[0] is False
    assert "unpadded boundaries" in before[1]


@pytest.mark.no_distributed
def test_the_fixup_rolls_the_probe_pack_on_padded_boundaries_and_leaves_others_alone() -> None:
    """Inside the set, roll_tensor rolls a padded pack on its padded boundaries; unpadded packs and bshd as before."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer import multi_token_prediction as mtp

    from patches.megatron._fixups import PROBE_PACK

    _needed()
    cu, padded, want = (torch.tensor(v, dtype=torch.int32) for v in PROBE_PACK)
    pack = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
                           cu_seqlens_kv_padded=padded, max_seqlen_q=8, max_seqlen_kv=8)  # fmt: skip
    plain = PackedSeqParams(qkv_format="thd", cu_seqlens_q=padded, cu_seqlens_kv=padded, max_seqlen_q=8,
                            max_seqlen_kv=8)  # fmt: skip
    tensor = torch.arange(1, 17, dtype=torch.int32)[None]
    before = [mtp.roll_tensor(tensor, -1, -1, None, p)[0] for p in (plain, None)]
    with patchreg.Registry("fixups").patched(MTP_FIXUPS_SET):
        assert torch.equal(mtp.roll_tensor(tensor, packed_seq_params=pack)[0][0], want)
        assert torch.equal(mtp.roll_tensor(tensor, -1, -1, None, pack)[0][0], want)  # positional, as a caller may
        after = [mtp.roll_tensor(tensor, -1, -1, None, p)[0] for p in (plain, None)]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    assert pack.cu_seqlens_q is cu  # the caller's pack is not modified


def test_the_block_applies_the_fixup_only_around_a_padded_forward() -> None:
    """mtp_patched installs packed_padded_roll during a padded pack's forward only: not at enter, not after it."""
    from megatron.core.transformer import multi_token_prediction as mtp

    _needed()
    model, bshd = build_gpt(), bshd_batch()
    upstream_roll = vars(mtp)["roll_tensor"]
    seen: list[bool] = []
    model.mtp.layers[0].register_forward_pre_hook(lambda *_: seen.append(vars(mtp)["roll_tensor"] is not upstream_roll))
    with mtp_patched(model, detach_encoder=True) as report:
        assert vars(mtp)["roll_tensor"] is upstream_roll
        _step(model, bshd)
        _step(model, packed_batch(bshd))
        assert vars(mtp)["roll_tensor"] is upstream_roll
    assert seen == [False, True]
    assert "fix-up packed_padded_roll: applied around each forward given a padded pack" in str(report)


@pytest.mark.no_distributed
def test_each_fixup_says_whether_it_applies_here() -> None:
    """Every fix-up of MTP_FIXUPS_SET answers with a reason (the matrix prints it per release), and where the
    probe finds upstream wrong on a release with a packed MTP roll, packed_padded_roll applies."""
    states = {}
    for patch in MTP_FIXUPS_SET:
        answer = patch.when.evaluate()
        assert answer.reason
        why = answer.reason.rsplit("needed: ", 1)[-1] if answer.ok else answer.reason  # the probe's own words
        states[patch.name] = f"active ({why})" if answer.ok else why
    record_measurement("fixups", states)  # type: ignore[arg-type]
    from patches.megatron._fixups import padded_roll_is_right

    try:
        from megatron.core.transformer.multi_token_prediction import roll_tensor
    except ImportError:
        roll_tensor = None
    takes_packs = roll_tensor is not None and "packed_seq_params" in roll_tensor.__code__.co_varnames
    if takes_packs and not padded_roll_is_right()[0]:
        assert PACKED_PADDED_ROLL.when.evaluate().ok
