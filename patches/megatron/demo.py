"""PPO-style steps on a tiny real Megatron-Core GPTModel with MTP, on CPU: ``python -m patches.megatron.demo``.

The demo of the installed package (``make demo`` and ``examples/ppo_step.py`` run it too); ``--verify`` runs
``verify_mtp`` on the same model instead (``examples/verify_mtp.py``). Needs ``patchreg[megatron]`` (torch and
megatron-core); nothing else, no checkout.

Megatron-Core needs a process group and its parallel state before a model is built (:func:`setup`: one gloo
process, TP = PP = 1). On CPU the model is *built* under ``cpu_patched()`` too: Megatron-Core reaches for CUDA
while building (``model_parallel_cuda_manual_seed`` seeds the CUDA RNG tracker, and the layers' init forks it), so
on a machine without a GPU a model built outside the block fails with "Found no NVIDIA driver".

Inside ``with cpu_patched(), mtp_patched(model, detach_encoder=True)`` the model returns logits, the PPO clipped
policy loss is computed from them, and the MTP loss rides along (training only the MTP layers). After the block the
demo shows that every namespace the two sets touched holds the same objects as before, and that the model's
upstream per-token loss is bit-equal to that of a never-patched twin holding the same weights.

:func:`build_model`, :func:`rollout` and :func:`ppo_loss` are the README tour's model and batch.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import textwrap
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from patches.megatron import CPU_SET, MTP_DETACH_SET, cpu_patched, mtp_patched, verify_mtp

__all__ = ["build_model", "main", "ppo_loss", "quiet", "rollout", "setup"]

VOCAB, SEQ, BATCH, STEPS = 128, 16, 4, 3
_WIDTH = 100


def quiet() -> None:
    """Silence the libraries' own noise for the demo (patchreg itself never touches warning filters or log levels).

    Megatron-Core's "Transformer Engine and Apex are not installed", "absl.logging is not installed", a deprecated
    recompute scope, "GPTModel IS DEPRECATED"; torch's "No CUDA runtime is found, using CUDA_HOME=..."; and
    Megatron-Core 0.19.2's "tp_group is None" DeprecationWarning, which its own ``RowParallelLinear.forward`` causes
    (it passes ``tp_group=None`` to its linear function, whatever the model's config), so no config can avoid it.
    """
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron(\.|$)")
    warnings.filterwarnings(
        "ignore", message=r".*(Transformer Engine|Apex is not installed|absl\.logging|scope is deprecated)"
    )
    warnings.filterwarnings("ignore", message=r".*tp_group is None", category=DeprecationWarning)
    logging.getLogger("megatron").setLevel(logging.ERROR)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def setup() -> None:
    """One gloo process (on a free port) and Megatron-Core's parallel state (TP = PP = 1)."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def build_model() -> Any:
    """A tiny GPTModel with two MTP depths (hidden 64, 2 heads, 2 layers, fp32); on CPU, build it under
    ``cpu_patched()``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=2, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0, mtp_num_layers=2, mtp_loss_scaling_factor=0.1,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec()
    mlp = spec.submodules.mlp  # Megatron asks for the MLP's width (else a DeprecationWarning): the config's
    if isinstance(mlp, functools.partial):  # 0.19: a builder, called with the layer's arguments
        spec.submodules.mlp = functools.partial(mlp, ffn_hidden_size=config.ffn_hidden_size)
    else:  # a ModuleSpec: its params reach MLP.__init__ (every release takes ffn_hidden_size)
        mlp.params = {**mlp.params, "ffn_hidden_size": config.ffn_hidden_size}
    torch.manual_seed(0)
    tp_random.model_parallel_cuda_manual_seed(0)
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )  # fmt: skip


def rollout(step: int) -> dict[str, Any]:
    """A fake rollout batch: prompt tokens masked out, advantages and old log-probs."""
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ)
    mask[:, :4] = 0  # the prompt
    mask[:, -1] = 0  # the last label (input_ids rolled around) is no real token, as an RL actor masks it
    return {
        "input_ids": ids,
        "position_ids": torch.arange(SEQ).expand(BATCH, SEQ),
        "attention_mask": torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None],
        "labels": torch.roll(ids, -1, dims=1),
        "loss_mask": mask,
        "advantages": torch.randn(BATCH, SEQ, generator=gen),
        "old_logp": None,
    }


def ppo_loss(logits: Any, batch: dict[str, Any], clip: float = 0.2) -> Any:
    """Clipped policy-gradient loss over the response tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    old = logp.detach() if batch["old_logp"] is None else batch["old_logp"]
    ratio = torch.exp(logp - old)
    adv = batch["advantages"]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return (per_token * batch["loss_mask"]).sum() / batch["loss_mask"].sum()


def _namespaces(model: Any) -> dict[str, Any]:
    """Every namespace the two sets may touch, by name: the model, its MTP layers and config, the sets' modules and
    classes."""
    found = {"model": model, **{f"model.mtp.layers[{i}]": layer for i, layer in enumerate(model.mtp.layers)}}
    found["model.config"] = model.config  # 0.19.2: the block sets config.mtp_detach_heads for its duration
    for patch in (*CPU_SET.patches, *MTP_DETACH_SET.patches):
        if isinstance(patch.target, str) and ":" in patch.target:  # an import path "pkg.mod:Qual.attr"
            module_name, qualname = patch.target.split(":")
            holder, parts = importlib.import_module(module_name), qualname.split(".")[:-1]
            for part in parts:
                holder = getattr(holder, part, None)
            if holder is not None:
                found[":".join([module_name, *parts[:1]]) if parts else module_name] = holder
    return found


def _snapshot(objects: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A copy of each namespace (``vars()``): the same keys bound to the same objects."""
    return {label: dict(vars(obj)) for label, obj in objects.items()}


def _same(now: dict[str, Any], before: dict[str, Any]) -> bool:
    """True when ``now`` holds exactly the keys of ``before``, each bound to the very same object."""
    return now.keys() == before.keys() and all(now[k] is v for k, v in before.items())


def _steps(model: Any) -> tuple[Any, list[str], list[bool]]:
    """The PPO steps inside both blocks; the report, the namespaces the block touched, and whether each is restored."""
    objects = _namespaces(model)
    before = _snapshot(objects)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with cpu_patched(), mtp_patched(model, detach_encoder=True) as report:
        touched = [label for label, obj in objects.items() if not _same(vars(obj), before[label])]
        for step in range(STEPS):
            batch = rollout(step)
            optimizer.zero_grad()
            logits = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"],
                           labels=batch["labels"], loss_mask=batch["loss_mask"])  # fmt: skip
            loss = ppo_loss(logits, batch)
            loss.backward()  # the MTP loss's gradient reaches the MTP layers only
            optimizer.step()
            depths = ", ".join(f"depth {i + 1} {v:.4f}" for i, v in enumerate(report.mtp_losses))
            print(f"step {step}: logits {tuple(logits.shape)}  policy loss {loss.item():+.4f}  mtp loss {depths}")
    return report, touched, [_same(vars(objects[label]), before[label]) for label in touched]


def run_demo() -> int:
    """The demo; 0 when every namespace is restored exactly and the upstream loss equals the twin's."""
    start = time.time()
    setup()
    with cpu_patched():  # the build needs the CPU shims too (see the module docstring)
        model, twin = build_model(), build_model()  # same seed: the same weights; `twin` is never MTP-patched
    report, touched, restored = _steps(model)
    print(report)
    print(f"after the block, the {len(touched)} namespaces the two sets touched hold the same objects as before:")
    kept = ", ".join(label for label, ok in zip(touched, restored, strict=True) if ok)
    print(textwrap.fill(f"restored exactly: {kept}", _WIDTH, initial_indent="  ", subsequent_indent="    "))
    for label, ok in zip(touched, restored, strict=True):
        if not ok:
            print(f"  CHANGED: {label}")
    twin.load_state_dict(model.state_dict())  # the weights the steps trained
    probe = rollout(100)
    with cpu_patched():  # CPU shims only: no MTP patch on either model
        args = (probe["input_ids"], probe["position_ids"], probe["attention_mask"])
        ours, theirs = model(*args, labels=probe["labels"]), twin(*args, labels=probe["labels"])
    equal = bool(torch.equal(ours, theirs))
    verdict = "bit-equal to" if equal else "DIFFERENT from"
    print(f"upstream loss after the block: shape {tuple(ours.shape)}, {verdict} a never-patched twin's (same weights)")
    dist.destroy_process_group()
    print(f"done in {time.time() - start:.1f}s")
    return 0 if touched and all(restored) and equal else 1


def run_verify() -> int:
    """``verify_mtp`` on the demo's model, both detach modes; 0 when every check passes."""
    setup()
    with cpu_patched():  # on a GPU leave cpu_patched() out
        model = build_model()
        batch = rollout(0)
        kwargs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask", "labels", "loss_mask")}
        results = [verify_mtp(model, kwargs, detach_encoder=detach) for detach in (True, False)]
    for result in results:
        print(result)
    dist.destroy_process_group()
    return 0 if all(r.ok for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m patches.megatron.demo [--verify]``: the demo, or ``verify_mtp`` on its model; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m patches.megatron.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="run verify_mtp on the demo's model instead")
    args = parser.parse_args(argv)
    quiet()
    return run_verify() if args.verify else run_demo()


if __name__ == "__main__":
    raise SystemExit(main())
