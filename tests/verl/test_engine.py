"""``patches.verl``'s ``patch_engine_mtp`` inside verl's real ``MegatronEngine.initialize``: held per engine, then released."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from patches.megatron._native import native
from tests.verl.conftest import build_model, make_engine, needs_verl, tiny_engine_class

pytestmark = needs_verl


def _snapshot(obj: Any) -> dict[str, int]:
    """The keys of ``vars(obj)`` and the identity of what each holds."""
    return {k: id(v) for k, v in vars(obj).items()}


def _mtp_layers(gpt: Any) -> list[Any]:
    return list(gpt.mtp.layers)


def test_engine_holds_our_set_and_never_verls(cpu: Any, verl_mtp: Any) -> None:
    """initialize() installs patchreg's detached MTP set on the chunk; verl's own MTP patches are never applied."""
    import patchreg
    from patches.verl import engine_report

    engine = make_engine(detach_encoder=True)
    gpt = engine.module[0]
    record = engine_report(engine)
    assert record is not None and not record.released and record.detach_encoder
    assert record.report.name == "megatron-mtp-detached" and record.installed >= 2
    if native():  # 0.19.2: upstream's RL mode, no replacement of an upstream body
        assert patchreg.registry.is_active("rl_mode_forward", gpt) and gpt.config.mtp_detach_heads is True
    else:
        assert patchreg.registry.is_active("postprocess_detached", gpt)
        assert patchreg.registry.is_active("detach_embeddings", _mtp_layers(gpt)[0])
    assert "_postprocess_backup" not in vars(gpt)  # verl's patch_postprocess leaves this behind
    assert all("_get_embeddings_backup" not in vars(layer) for layer in _mtp_layers(gpt))
    assert "megatron-mtp-detached" in str(record) and "held" in str(record)
    del engine, gpt, record
    gc.collect()


def test_detach_encoder_false_chooses_the_trunk_training_set(cpu: Any, verl_mtp: Any) -> None:
    """model_config.mtp.detach_encoder=False gives MTP_SET (the MTP loss trains the trunk, as upstream)."""
    from patches.verl import engine_report

    engine = make_engine(detach_encoder=False)
    record = engine_report(engine)
    assert record is not None and record.report.name == "megatron-mtp" and not record.detach_encoder
    del engine, record
    gc.collect()


def test_model_is_freed_and_installs_released_when_the_engine_goes(cpu: Any, verl_mtp: Any) -> None:
    """Dropping the engine frees its model and reverts its installs (a finalizer on the engine, no strong refs)."""
    import patchreg
    from patches.verl import engine_report, engine_reports

    engine = make_engine(detach_encoder=True)
    model = weakref.ref(engine.module[0])
    record = engine_report(engine)
    assert record is not None
    del engine
    gc.collect()
    assert model() is None
    assert record.released
    assert not [e for e in patchreg.registry.active() if e.patch in ("postprocess_detached", "detach_embeddings")]
    assert record not in list(engine_reports())


def test_release_restores_the_chunk_exactly(cpu: Any, verl_mtp: Any) -> None:
    """An early release() leaves every namespace it touched with the same keys bound to the same objects."""
    from patches.verl import engine_report

    gpt = build_model()
    before = [_snapshot(gpt), *(_snapshot(layer) for layer in _mtp_layers(gpt))]
    engine = tiny_engine_class()([gpt], True)
    engine.initialize()
    record = engine_report(engine)
    assert record is not None and record.installed >= 2
    assert _snapshot(gpt) != before[0]
    assert record.release() >= 2 and record.release() == 0  # idempotent; the finalizer later does nothing
    assert [_snapshot(gpt), *(_snapshot(layer) for layer in _mtp_layers(gpt))] == before
    del engine, record, gpt
    gc.collect()


def test_revert_of_the_set_restores_verls_functions(cpu: Any) -> None:
    """Reverting VERL_MTP puts verl's own patch_engine_mtp and MegatronEngine.initialize back (identity)."""
    import verl.utils.megatron_utils as megatron_utils
    import verl.workers.engine.megatron.transformer_impl as impl

    import patchreg
    from patches.verl import VERL_MTP, patch_engine_mtp

    theirs, init = impl.patch_engine_mtp, vars(impl.MegatronEngine)["initialize"]
    report = patchreg.apply(VERL_MTP, lazy=True)
    assert impl.patch_engine_mtp is patch_engine_mtp
    assert megatron_utils.patch_engine_mtp is theirs  # not patched where nobody looks it up
    assert vars(impl.MegatronEngine)["initialize"] is not init
    patchreg.revert(report)
    assert impl.patch_engine_mtp is theirs is megatron_utils.patch_engine_mtp
    assert vars(impl.MegatronEngine)["initialize"] is init


def test_called_outside_an_engine_ties_the_install_to_the_first_chunk(cpu: Any) -> None:
    """patch_engine_mtp called directly (no engine initializing) holds the set until the chunk itself goes."""
    from verl.workers.config.model import MtpConfig

    import patchreg
    from patches.verl import engine_report, patch_engine_mtp

    gpt = build_model()
    config = type("ModelConfig", (), {"mtp": MtpConfig(enable=True, detach_encoder=True)})()
    record = patch_engine_mtp([gpt], config)
    held = "rl_mode_forward" if native() else "postprocess_detached"  # 0.19.2: upstream's RL mode
    assert engine_report(gpt) is record and patchreg.registry.is_active(held, gpt)
    ref = weakref.ref(gpt)
    del gpt
    gc.collect()
    assert ref() is None and record.released


def test_bad_arguments_are_named(cpu: Any) -> None:
    """A model config without an mtp section, or no chunks, is refused with the remedy and installs nothing."""
    from verl.workers.config.model import MtpConfig

    import patchreg
    from patches.verl import patch_engine_mtp

    with pytest.raises(TypeError, match=r"model config with an 'mtp' section"):
        patch_engine_mtp([build_model()], object())
    with pytest.raises(ValueError, match="no model chunks"):
        patch_engine_mtp([], type("C", (), {"mtp": MtpConfig(enable=True)})())
    assert not [e for e in patchreg.registry.active() if e.patch.startswith(("postprocess", "detach", "checkpointed"))]
