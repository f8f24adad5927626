"""The upstream bodies the MTP patches were verified against (drift detection, ``Patch(verified=...)``).

Fingerprints of the functions each patch replaces, computed on each release's own installed
source (``python -m patchreg body PATH`` under the release, as ``make test-matrix`` runs
it) when its tests passed: megatron-core 0.13.1, 0.14.0, 0.15.3, 0.16.1, 0.17.1, 0.18.2, 0.19.2.
A release whose body is none of these makes ``doctor`` and the patch's report say "upstream body
changed since verification: review"; re-run the matrix and add its fingerprint here.
"""

from __future__ import annotations

from patches.megatron._compat import GPT, MTP
from patchreg import Verified

__all__ = ["CHECKPOINTED_FORWARD_BODY", "GET_EMBEDDINGS_BODY", "POSTPROCESS_BODY"]

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
