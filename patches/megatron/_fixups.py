"""Fix-ups for Megatron-Core MTP bugs that give wrong numbers without raising.

``packed_padded_roll``: on packed (``thd``) sequences with per-sequence padding
(``cu_seqlens_q_padded``, as verl and Megatron's own data path build them),
``multi_token_prediction.roll_tensor`` rolls on the *unpadded* boundaries ``cu_seqlens_q``
(0.16.1-0.19.2; Megatron-LM #4495, #6205). Two sequences of 5 and 6 tokens, each padded to 8:
rolling ``1..16`` gives ``[2,3,4,5,0,7,8,9,10,11,0,12,13,14,15,16]`` where the padded layout needs
``[2,3,4,5,6,7,8,0,10,...,16,0]``: a pad slot trains on the next sequence's first token, labels
stay unshifted and a valid target is lost, for the MTP labels, the loss mask and the MTP layers'
input ids alike. The fix-up is a wrap of ``roll_tensor`` (every caller in the module reads it as a
module global: ``process_mtp_loss``, ``MultiTokenPredictionLayer._get_embeddings``, and the
patches' own roll) that hands upstream's body the padded boundaries, the layout the tensor has.

It is gated by a behavioural probe: upstream's own ``roll_tensor`` on that known pack. Where it
already rolls on the padded boundaries the patch is skipped as not needed.

``mtp_patched`` applies it around each forward that gets a padded pack (:func:`around_forward`), not
for the whole block: a module attribute among the block's installs would take every enter and exit off
the engine's clean path (measured: 5 µs -> 21 µs per cycle), while a padded pack's forward pays ~20 µs
once. Users of upstream's own MTP apply ``MTP_FIXUPS_SET`` themselves
(``with patchreg.registry.patched(MTP_FIXUPS_SET): ...``).
"""

from __future__ import annotations

import copy
from typing import Any

import patchreg
from patches.megatron._compat import GPT, MTP, absent, upstream
from patches.megatron._loss import rolls
from patches.megatron._verified import ROLL_PACKED_BODY
from patchreg import Patch, PatchSet, accepts, check, has, not_needed_when, requires

__all__ = [
    "MTP_FIXUPS_SET",
    "PACKED_PADDED_ROLL",
    "PACKED_PADDED_ROLL_GPT",
    "PROBE_PACK",
    "around_forward",
    "fixup_lines",
    "needed",
    "padded_roll_is_right",
    "roll_on_padded_boundaries",
]

#: The probe's pack: (unpadded cu_seqlens, padded cu_seqlens, the roll of 1..16 on the padded boundaries).
PROBE_PACK = (
    (0, 5, 11),
    (0, 8, 16),
    (2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12, 13, 14, 15, 16, 0),
)
_PACKED_POSITION = 4  # roll_tensor(tensor, shifts, dims, cp_group, packed_seq_params)


def _on_padded_boundaries(packed: Any) -> Any:
    """``packed`` with ``cu_seqlens_q`` set to its padded boundaries (a shallow copy), or itself when it has none."""
    padded = getattr(packed, "cu_seqlens_q_padded", None)
    if padded is None or padded is packed.cu_seqlens_q:
        return packed
    view = copy.copy(packed)  # no __post_init__: the copy shares every tensor, only one field differs
    view.cu_seqlens_q = padded
    return view


def roll_on_padded_boundaries(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Roll packed sequences on their padded boundaries (``cu_seqlens_q_padded``) where the pack has them."""
    if len(args) > _PACKED_POSITION:
        if args[_PACKED_POSITION] is not None:
            args = (*args[:_PACKED_POSITION], _on_padded_boundaries(args[_PACKED_POSITION]), *args[5:])
        return wrapped(*args, **kwargs)
    packed = kwargs.get("packed_seq_params")
    if packed is not None:
        kwargs = {**kwargs, "packed_seq_params": _on_padded_boundaries(packed)}
    return wrapped(*args, **kwargs)


def padded_roll_is_right() -> tuple[bool, str]:
    """Whether upstream's ``roll_tensor`` rolls a padded pack on its padded boundaries (the probe's answer)."""
    missing = absent("torch", "megatron.core")
    if missing:
        return False, missing
    import torch

    try:
        roll_tensor = upstream(MTP, "roll_tensor")
        params = upstream("megatron.core.packed_seq_params", "PackedSeqParams")
    except ImportError as exc:
        return False, f"megatron-core cannot be imported ({exc})"
    roll_tensor = getattr(roll_tensor, "__wrapped__", roll_tensor)  # upstream's own, under any wrap
    cu, padded, want = (torch.tensor(values, dtype=torch.int32) for values in PROBE_PACK)
    pack = params(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
                  cu_seqlens_kv_padded=padded, max_seqlen_q=8, max_seqlen_kv=8)  # fmt: skip
    got = rolls((torch.arange(1, 17, dtype=torch.int32)[None],), None, pack, roll_tensor=roll_tensor)[0]
    shown = got[0].tolist()
    if torch.equal(got[0], want.to(got.dtype)):
        return True, "roll_tensor rolls a padded pack on its padded boundaries (cu_seqlens_q_padded): fixed upstream"
    return (
        False,
        f"roll_tensor rolls a padded pack on the unpadded boundaries (1..16 of 5+6 tokens padded to 8 -> {shown})",
    )


def _no_packed_roll() -> tuple[bool, str]:
    """Before 0.16 ``roll_tensor`` takes no ``packed_seq_params``: MTP has no packed roll to fix."""
    try:
        roll_tensor = upstream(MTP, "roll_tensor")
    except ImportError as exc:
        return False, f"megatron-core cannot be imported ({exc})"
    if roll_tensor is None or not accepts(f"{MTP}:roll_tensor", "packed_seq_params").evaluate().ok:
        return True, "roll_tensor takes no packed_seq_params on this release: MTP has no packed roll to fix"
    return False, "roll_tensor rolls packed sequences (packed_seq_params)"


_NO_PACKED_ROLL = not_needed_when(check(_no_packed_roll, "MTP has no packed roll on this release"))
_PADDED_ROLL_IS_RIGHT = check(padded_roll_is_right, "roll_tensor rolls a padded pack on its padded boundaries")

PACKED_PADDED_ROLL = Patch(
    "packed_padded_roll",
    f"{MTP}:roll_tensor",
    roll_on_padded_boundaries,
    kind="wrap",
    when=_NO_PACKED_ROLL & requires("megatron-core>=0.16") & not_needed_when(_PADDED_ROLL_IS_RIGHT),
    doc="MTP rolls packed sequences on their padded boundaries (cu_seqlens_q_padded), as the pack is laid out",
    verified=ROLL_PACKED_BODY,
)


def _gpt_rolls_through_mtp() -> tuple[bool, str]:
    """0.17+: gpt_model imports no roll_tensor (its MTP loss is process_mtp_loss's, which packed_padded_roll covers)."""
    missing = absent("megatron.core")
    if missing:
        return False, missing
    if has(f"{GPT}:roll_tensor").evaluate().ok:
        return False, "GPTModel._postprocess rolls the MTP labels with the roll_tensor gpt_model imported (0.16)"
    return True, "gpt_model imports no roll_tensor: its MTP loss rolls through the MTP module's (packed_padded_roll)"


# 0.16 computes the MTP loss inline in GPTModel._postprocess with the roll_tensor gpt_model imported by name
# (0.17+ call process_mtp_loss in the MTP module): upstream's own labels and mask roll through this one.
PACKED_PADDED_ROLL_GPT = Patch(
    "packed_padded_roll_gpt",
    f"{GPT}:roll_tensor",
    roll_on_padded_boundaries,
    kind="wrap",
    when=_NO_PACKED_ROLL
    & requires("megatron-core>=0.16")
    & not_needed_when(check(_gpt_rolls_through_mtp, "gpt_model calls no roll_tensor of its own"))
    & accepts(f"{GPT}:roll_tensor", "packed_seq_params")
    & not_needed_when(_PADDED_ROLL_IS_RIGHT),
    doc="as packed_padded_roll, for the roll_tensor gpt_model imported by name (0.16: the MTP loss's labels and mask)",
    verified=ROLL_PACKED_BODY,
)

MTP_FIXUPS_SET = PatchSet(
    "megatron-mtp-fixups",
    (PACKED_PADDED_ROLL, PACKED_PADDED_ROLL_GPT),
    doc="fix-ups of upstream MTP bugs that give wrong numbers silently; for upstream's own MTP, without mtp_patched",
)

_NEEDED: list[bool] = []  # the predicate's answer, once read (it is cached by the engine too)


def needed() -> bool:
    """Whether the packed-roll fix-up installs on this release (its predicate, read once)."""
    if not _NEEDED:
        _NEEDED.append(PACKED_PADDED_ROLL.when.evaluate().ok)
    return _NEEDED[0]


def around_forward(packed: Any) -> Any:
    """The block of ``MTP_FIXUPS_SET`` for one patched forward given ``packed`` (a padded pack, where the fix-up
    is needed), else None: the caller runs the forward as it is."""
    if packed is None or getattr(packed, "cu_seqlens_q_padded", None) is None or not needed():
        return None
    return patchreg.registry.patched(MTP_FIXUPS_SET)


def fixup_lines() -> list[str]:
    """One line per fix-up for ``str(MTPReport)``: what the block does with it here, and why."""
    answer = PACKED_PADDED_ROLL.when.evaluate()
    if answer.ok:  # the probe's own finding, once (the predicate's reason repeats each part's "needed: ...")
        why = _PADDED_ROLL_IS_RIGHT.evaluate().reason
        how = f"applied around each forward given a padded pack (cu_seqlens_q_padded), since upstream's {why}"
    else:
        how = f"not applied: {answer.reason}"
    return [f"fix-up {PACKED_PADDED_ROLL.name}: {how}"]
