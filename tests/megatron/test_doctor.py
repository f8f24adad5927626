"""`python -m patchreg doctor` on the MTP sets, on whichever megatron-core release is installed."""

from __future__ import annotations

import io
import json

import pytest
from packaging.version import Version

import patchreg
from patches.megatron._native import UPSTREAM, native
from patchreg._cli import run

pytest.importorskip("megatron.core", reason="megatron-core is not installed")
mcore = Version(Version(str(patchreg.provider("megatron-core").version)).base_version)  # the code imported


#: Megatron-LM's main (0.20.0) and dev (0.19.0) snapshots, imported from a tree: their MTP bodies were never
#: verified (doctor --against names the diffs, tests/patchreg/test_audit.py), so doctor says they drifted and exits 1.
SNAPSHOT = patchreg.provider("megatron-core").source is not None and str(mcore) in ("0.20.0", "0.19.0")


def fine(status: int, rows: dict[str, dict[str, object]]) -> bool:
    """doctor's exit status is 0; on a snapshot, 1 with an upstream body drifted as the only thing wrong."""
    drifted = {k for k, r in rows.items() if not r["body_ok"]}
    if SNAPSHOT and drifted:
        return status == 1 and all(r["install"] or not r["needed"] for r in rows.values())
    return status == 0 and not drifted


def doctor(*names: str) -> tuple[int, dict[str, dict[str, object]]]:
    """Run `doctor --json` in-process; return the exit status and the rows keyed by set.patch."""
    out = io.StringIO()
    status = run(["doctor", "--json", *names], out=out)
    rows = {f"{r['set']}.{r['patch']}": r for r in json.loads(out.getvalue()) if "patch" in r}
    return status, rows


def test_doctor_answers_per_release() -> None:
    """Every MTP patch installs or is not needed on 0.14+ (exit 0); 0.13 skips _get_embeddings (it has none: exit 1)
    and needs no recompute patch (it has no MTP recompute), whatever part of the predicate fails first."""
    status, rows = doctor("megatron-mtp", "megatron-mtp-detached")
    post = rows["megatron-mtp-detached.postprocess_detached"]
    emb = rows["megatron-mtp-detached.detach_embeddings"]
    ckpt = rows["megatron-mtp-detached.checkpointed_forward"]
    if native():  # 0.19.2: upstream's RL mode carries it; the native route's patches install
        assert (post["install"], post["needed"]) == (False, False) and UPSTREAM in str(post["reason"]), post
        assert all(rows[f"megatron-mtp-detached.{n}"]["install"] for n in ("mtp_detach_heads", "rl_mode_forward"))
        assert rows["megatron-mtp.postprocess"]["needed"] is False and emb["needed"] is False
    else:
        assert post["install"] is True
        assert rows["megatron-mtp-detached.rl_mode_forward"]["install"] is False
    if mcore < Version("0.14"):
        assert status == 1
        assert (emb["install"], ckpt["install"]) == (False, False)
        assert "_get_embeddings does not exist" in str(emb["reason"])
        assert ckpt["needed"] is False and "no MTP recompute on this release" in str(ckpt["reason"])
        return
    assert fine(status, rows), rows
    assert emb["install"] is not native()
    if mcore >= Version("0.19"):
        assert (ckpt["install"], ckpt["needed"]) == (False, False)
        assert "fixed upstream" in str(ckpt["reason"])
    else:
        assert ckpt["install"] is True


def dev_tracker() -> bool:
    """Whether the MTP tracker has dev's form: save_loss_to_tracker(loss_sum, num_tokens, ...)."""
    import inspect

    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper as helper

    save = getattr(helper, "save_loss_to_tracker", None)
    return save is not None and "loss_sum" in inspect.signature(save).parameters


def test_doctor_cpu_shims_per_release() -> None:
    """Each CPU shim installs or is not needed (exit 0): the MTP tracker shim follows the helper the release logs
    the MTP loss with (save_loss_to_tracker 0.14-0.18, save_metrics_to_tracker 0.19+, both on dev); 0.13 needs neither."""
    status, rows = doctor("megatron-cpu")
    loss = rows["megatron-cpu.mtp_tracker_device"]
    metrics = rows["megatron-cpu.mtp_metrics_device"]
    assert status == 0, rows
    if dev_tracker():  # dev logs through save_loss_to_tracker(loss_sum, ...) and keeps save_metrics_to_tracker
        assert (loss["install"], metrics["install"]) == (True, True)
    elif mcore >= Version("0.19"):
        assert (loss["install"], loss["needed"]) == (False, False)
        assert "save_metrics_to_tracker" in str(loss["reason"]) and "mtp_metrics_device" in str(loss["reason"])
        assert metrics["install"] is True
    else:
        assert (metrics["install"], metrics["needed"]) == (False, False)
        assert "save_loss_to_tracker" in str(metrics["reason"])
        if mcore < Version("0.14"):
            assert (loss["install"], loss["needed"]) == (False, False)
            assert "loss's device" in str(loss["reason"])
        else:
            assert loss["install"] is True


def test_doctor_on_the_fixups() -> None:
    """The fix-ups are fine on every release (exit 0): not needed before 0.16 (no packed MTP roll) and where upstream
    rolls a padded pack right; packed_padded_roll installs where the probe finds the unpadded roll (0.16.1-0.19.2)."""
    from patches.megatron._fixups import padded_roll_is_right

    status, rows = doctor("megatron-mtp-fixups")
    roll = rows["megatron-mtp-fixups.packed_padded_roll"]
    gpt = rows["megatron-mtp-fixups.packed_padded_roll_gpt"]
    assert fine(status, rows), rows
    if mcore < Version("0.16"):
        assert (roll["install"], roll["needed"]) == (False, False)
        assert "no packed roll" in str(roll["reason"])
        return
    assert roll["install"] is (not padded_roll_is_right()[0])
    assert gpt["install"] is (mcore < Version("0.17") and not padded_roll_is_right()[0])
