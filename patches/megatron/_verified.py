"""The upstream bodies the MTP patches were verified against (drift detection, ``Patch(verified=...)``).

Fingerprints of the functions each patch replaces, computed on each release's own installed
source (``python -m patchreg body PATH`` under the release, as ``make test-matrix`` runs
it) when its tests passed: megatron-core 0.13.1, 0.14.0, 0.15.3, 0.16.1, 0.17.1, 0.18.2, 0.19.2.
A release whose body is none of these makes ``doctor`` and the patch's report say "upstream body
changed since verification: review"; re-run the matrix and add its fingerprint here.

The HybridModel / MambaModel patches are verified where they install: 0.17.1 (MambaModel, MTP and loss
inline in ``forward``) and 0.18.2, 0.19.2 (HybridModel). Their forward is read as
``MambaModel.forward``: on 0.17 it is MambaModel's own, on 0.18+ MambaModel is a HybridModel and
inherits ``HybridModel.forward`` (``test_verified_bodies`` checks that it still does), so one path
names the body both classes run on every release that has them.
"""

from __future__ import annotations

from patches.megatron._compat import GPT, MTP
from patches.megatron._models import HYBRID, MAMBA
from patchreg import Verified

__all__ = [
    "CHECKPOINTED_FORWARD_BODY",
    "GET_EMBEDDINGS_BODY",
    "GPT_MTP_LOSS_BODY",
    "HYBRID_FORWARD_BODY",
    "HYBRID_MTP_LOSS_BODY",
    "MAMBA_MTP_LOSS_BODY",
    "MTP_BLOCK_FORWARD_BODY",
    "POSTPROCESS_BODY",
    "ROLL_PACKED_BODY",
]

POSTPROCESS_BODY = Verified(
    "megatron-core",
    f"{GPT}:GPTModel._postprocess",
    {
        "0.13.1": "32ca95a72ba114c7",
        "0.14.0": "5157b75c8d1e17e9",
        "0.15.3": "6415ace246f1d59d",
        "0.16.1": "b17bed442351ee28",
        "0.17.1": "6c59677042d0ed88",
        "0.18.2": "b0d2b354a7d7dddc",
        "0.19.2": "46d5249fdb6a8283",
    },
)

GET_EMBEDDINGS_BODY = Verified(
    "megatron-core",
    f"{MTP}:MultiTokenPredictionLayer._get_embeddings",
    {
        ">=0.14,<0.16": "1071ffc33dd1c3ce",
        ">=0.16,<0.18": "a8c47c66b01c4c75",
        "0.18.2": "e8d052839d050e46",
        "0.19.2": "79e44068ff8bb254",
    },
)

CHECKPOINTED_FORWARD_BODY = Verified(
    "megatron-core",
    f"{MTP}:MultiTokenPredictionLayer._checkpointed_forward",
    {
        ">=0.14,<0.18": "70e957096b7db984",
        "0.18.2": "43a806452b6631ae",
        "0.19.2": "692318f438461328",
    },
)

# HybridModel (0.18+) / MambaModel 0.17: the forward the hybrid patches call with labels=None (it must return
# logits and hand the stacked MTP states to process_mtp_loss), the process_mtp_loss they take over for a model
# in the block (same function object in both modules on 0.18+), and the MTP block's forward whose output the
# detached patch splits (main states first, then one chunk per depth, along dim 0).
HYBRID_FORWARD_BODY = Verified(
    "megatron-core",
    f"{MAMBA}:MambaModel.forward",
    {
        "0.17.1": "68377ca5a20b46a8",
        "0.18.2": "53a50646121e9992",
        "0.19.2": "162017a5afff2f44",
    },
)

HYBRID_MTP_LOSS_BODY = Verified(
    "megatron-core",
    f"{HYBRID}:process_mtp_loss",
    {
        "0.18.2": "6eba785390e5672f",
        "0.19.2": "6a17b61f755092d2",
    },
)

# The native route (0.19.2+) hands a model's call to upstream's own process_mtp_loss in RL mode (labels=None):
# the body it relies on, as gpt_model imported it (HybridModel's is HYBRID_MTP_LOSS_BODY, the same function).
GPT_MTP_LOSS_BODY = Verified(
    "megatron-core",
    f"{GPT}:process_mtp_loss",
    {
        "0.19.2": "6a17b61f755092d2",
    },
)

MAMBA_MTP_LOSS_BODY = Verified(
    "megatron-core",
    f"{MAMBA}:process_mtp_loss",
    {
        "0.17.1": "6d05d0ff2b5584d0",
    },
)

MTP_BLOCK_FORWARD_BODY = Verified(
    "megatron-core",
    f"{MTP}:MultiTokenPredictionBlock.forward",
    {
        "0.17.1": "5b59b08d7d765e0c",
        "0.18.2": "9f47bee3e7d309fe",
        "0.19.2": "97b6206c48d50640",
    },
)

# The packed_padded_roll fix-up wraps roll_tensor and relies on the packed roll reading the boundaries from
# packed_seq_params.cu_seqlens_q alone (it hands it the padded ones): the body of _roll_tensor_packed_seq.
ROLL_PACKED_BODY = Verified(
    "megatron-core",
    f"{MTP}:_roll_tensor_packed_seq",
    {
        "0.16.1": "90277f58d699c6b6",
        "0.17.1": "24f0015d18248a39",
        "0.18.2": "24f0015d18248a39",
        "0.19.2": "24f0015d18248a39",
    },
)
