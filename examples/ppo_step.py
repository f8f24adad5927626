"""PPO-style steps on a tiny real Megatron-Core GPTModel with MTP, on CPU (``make demo``).

The demo lives in the installed package, so that it runs without a checkout as ``python -m patches.megatron.demo``;
this script runs the same: see ``patches/megatron/demo.py`` for the model, the batch, the steps and what they show.
"""

from __future__ import annotations

from patches.megatron.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
