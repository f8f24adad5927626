"""``doctor --against CANDIDATE``: each patch judged on a candidate's files, without importing it."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from patchreg import provider, refresh
from patchreg._cli import run
from patchreg._versions import Provider
from tests.patchreg.audit_sample import RELEASES

SAMPLE = "tests.patchreg.audit_sample"


def _tree(root: Path, version: str) -> Path:
    for name, text in RELEASES[version].items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """auditpkg_xyz 1.0's files first on sys.path (no metadata): the release the candidate would replace."""
    root = _tree(tmp_path / "installed", "1.0")
    monkeypatch.syspath_prepend(str(root))
    refresh()
    return root


def _audit(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    status = run(["-m", SAMPLE, "doctor", *args], out=out)
    refresh()
    return status, out.getvalue()


def _verdicts(args: list[str]) -> tuple[int, dict[str, str], dict[str, Any]]:
    status, text = _audit("--json", *args)
    report = json.loads(text)
    return status, {f"{p['set']}.{p['patch']}": p["verdict"] for p in report["patches"]}, report


def test_each_verdict_on_a_source_tree(installed: Path, tmp_path: Path) -> None:
    """install, not needed, unknown, changed (with the diff against the installed body) and would not install."""
    candidate = _tree(tmp_path / "candidate", "2.0")
    status, verdicts, report = _verdicts(["audit-fine", "audit-unknown", "audit-broken", "--against", str(candidate)])
    assert verdicts == {
        "audit-fine.installs": "install",
        "audit-fine.fixed-upstream": "not needed",
        "audit-unknown.probed": "unknown",
        "audit-broken.scale-changed": "changed",
        "audit-broken.too-new": "no",
        "audit-broken.no-param": "no",
        "audit-broken.no-target": "no",
    }
    assert status == 1
    rows = {p["patch"]: p for p in report["patches"]}
    assert rows["installs"]["body"].startswith("verified against this body (area, auditpkg-xyz 2.0 in ")
    assert rows["scale-changed"]["body"].startswith("upstream body changed since verification: review (scale, ")
    assert rows["scale-changed"]["diff"].splitlines() == [
        "--- installed (auditpkg-xyz 1.0 (source))",
        "+++ candidate",
        "@@ -1,2 +1,3 @@",
        "-def scale(x, factor=2):",
        "-    return x * factor",
        "+def scale(x, factor=2, *, offset=0):",
        "+    y = x * factor",
        "+    return y + offset",
    ]
    assert rows["too-new"]["reason"] == (
        f"auditpkg-xyz 2.0 (read from auditpkg_xyz/__init__.py in {candidate}; no distribution metadata); "
        "2.0 does not satisfy >=3"
    )
    assert rows["no-param"]["reason"] == f"auditpkg_xyz.geometry:scale does not accept round_to (in {candidate})"
    assert rows["no-target"]["reason"] == f"auditpkg_xyz.geometry:volume does not exist (in {candidate})"
    assert rows["probed"]["reason"] == "check('a probe') is a behavioural probe: it needs the import"
    assert "auditpkg_xyz" not in sys.modules


@pytest.mark.parametrize(
    ("sets", "status"), [(["audit-fine"], 0), (["audit-fine", "audit-unknown"], 3), (["audit-broken"], 1)]
)
def test_the_exit_status_says_fine_unknown_or_failed(
    installed: Path, tmp_path: Path, sets: list[str], status: int
) -> None:
    """0: every patch installs or is not needed; 3: nothing failed but some are unknown; 1: a failure."""
    assert _audit(*sets, "--against", str(_tree(tmp_path / "candidate", "2.0")))[0] == status


def test_the_text_report_shows_the_diff_and_the_untouched_sets(installed: Path, tmp_path: Path) -> None:
    """The table, each changed body once with its shortened diff, counts, and the sets the candidate does not touch."""
    candidate = _tree(tmp_path / "candidate", "2.0")
    status, text = _audit("audit-broken", "audit-elsewhere", "--against", str(candidate))
    assert status == 1
    lines = text.splitlines()
    assert lines[0].startswith("patchreg 0.1.0 doctor --against")
    assert any(line.startswith("candidate: auditpkg-xyz 2.0 (read from auditpkg_xyz/__init__.py in") for line in lines)
    assert "  auditpkg_xyz.geometry:scale" in lines
    assert "      +def scale(x, factor=2, *, offset=0):" in lines
    assert "4 patch(es) judged: 1 changed upstream, 3 would not install." in lines
    assert "Sets not touching the candidate, not judged (see `doctor`): audit-elsewhere." in lines
    assert max(len(line) for line in lines) <= 100


def _wheel(path: Path, version: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in RELEASES[version].items():
            zf.writestr(name, text)
        info = f"auditpkg_xyz-{version}.dist-info"
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: auditpkg-xyz\nVersion: {version}\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _sdist(path: Path, version: str) -> Path:
    project = _tree(path.parent / f"sdist-src/auditpkg_xyz-{version}/src", version).parent
    (project / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: auditpkg-xyz\nVersion: {version}\n")
    with tarfile.open(path, "w:gz") as tf:
        tf.add(project, arcname=project.name)
    return path


@pytest.mark.parametrize("make", [_wheel, _sdist], ids=["wheel", "sdist"])
def test_a_wheel_and_an_sdist_are_unpacked_and_judged_alike(
    installed: Path, tmp_path: Path, make: Callable[[Path, str], Path]
) -> None:
    """The same verdicts from the release's wheel (with its .dist-info) and its sdist (src layout, PKG-INFO)."""
    archive = make(tmp_path / ("a.whl" if make is _wheel else "a.tar.gz"), "2.0")
    status, verdicts, report = _verdicts(["audit-fine", "audit-broken", "--against", str(archive)])
    assert (status, verdicts["audit-fine.installs"], verdicts["audit-broken.scale-changed"]) == (
        1,
        "install",
        "changed",
    )
    assert report["versions"]["auditpkg-xyz"].startswith(
        f"auditpkg-xyz 2.0 (read from auditpkg_xyz/__init__.py in {archive.name}"
    )


@pytest.mark.parametrize(
    ("candidate", "says"),
    [
        ("no/such/dir", "no such file or directory"),
        ("not a requirement!", "is not a directory, a file or a requirement"),
    ],
)
def test_an_unreadable_candidate_is_a_usage_error(
    candidate: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A candidate that is neither a folder, a file nor a requirement exits 2, naming it and the remedy."""
    assert _audit("--against", candidate)[0] == 2
    assert says in capsys.readouterr().err


def test_against_with_env_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--against judges named sets; --env alongside it is refused."""
    assert _audit("--env", "--against", str(tmp_path))[0] == 2
    assert "leave out --env" in capsys.readouterr().err


# -- the real candidates: Megatron-LM main and dev snapshots, the 0.18.2 wheel, from the installed 0.19.2 ----

#: The patches whose verified upstream body each candidate changed (checked against the functions' diffs).
CHANGED = {
    "main": {
        "megatron-mtp-fixups.packed_padded_roll": "_roll_tensor_packed_seq",  # return_sum=True added
        "megatron-mtp-fixups.packed_padded_roll_gpt": "_roll_tensor_packed_seq",
        "megatron-mtp-detached.detach_embeddings": "MultiTokenPredictionLayer._get_embeddings",  # SP scatter
        "megatron-mtp-hybrid-detached.detach_embeddings": "MultiTokenPredictionLayer._get_embeddings",
        "megatron-mtp-hybrid.hybrid_forward": "MambaModel.forward",  # compute_mtp_loss
        "megatron-mtp-hybrid-detached.hybrid_forward_detached": "MambaModel.forward",
        "megatron-mtp-hybrid-detached.mtp_input_detached": "MultiTokenPredictionBlock.forward",  # mtp_hsm mixing
    },
    "0.18.2": {  # bodies verified only where the native route (0.19.2) or MambaModel 0.17 uses them
        "megatron-mtp.rl_mode_mtp_loss": "process_mtp_loss",
        "megatron-mtp-detached.rl_mode_mtp_loss": "process_mtp_loss",
        "megatron-mtp-hybrid.mamba_mtp_loss": "process_mtp_loss",
        "megatron-mtp-hybrid-detached.mamba_mtp_loss": "process_mtp_loss",
    },
}
MEGATRON_SETS = ["megatron-mtp-fixups", "megatron-mtp", "megatron-mtp-detached", "megatron-mtp-hybrid"]
MEGATRON_SETS += ["megatron-mtp-hybrid-detached", "megatron-cpu", "megatron-bridge"]
CPU_INSTALLS = {
    "memory_buffer_on_cpu",
    "rng_state_get",
    "rng_state_set",
    "rng_tracker_add",
    "rng_tracker_fork",
    "tp_gather_on_cpu",
    "causal_mask_on_cpu",
    "moe_router_on_cpu",
    "mla_local_attention",
    "packed_local_attention",
    "rope_init_on_cpu",
}


@pytest.fixture
def from_0192() -> None:
    """The verdicts below are judged from the default lane's megatron-core 0.19.2 (the diffs, "same as installed")."""
    refresh()
    if provider("megatron-core") != Provider("megatron-core", "megatron-core", "0.19.2"):
        pytest.skip(f"judged from megatron-core 0.19.2 as installed; here: {provider('megatron-core').describe()}")


def _real(candidate: Path | str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    out = io.StringIO()
    status = run(["doctor", "--json", *MEGATRON_SETS, "--against", str(candidate)], out=out)
    report = json.loads(out.getvalue())
    return status, {f"{p['set']}.{p['patch']}": p for p in report["patches"]}, report


def _imported_from(tree: Path) -> list[str]:
    return [m for m, mod in list(sys.modules.items()) if str(getattr(mod, "__file__", "") or "").startswith(str(tree))]


@pytest.mark.parametrize("branch", ["main", "dev"])
def test_the_snapshots_verdicts(megatron_tree: Callable[..., Path], branch: str, from_0192: None) -> None:
    """main and dev: the CPU shims install, the changed MTP bodies are named with their diffs, megatron-bridge is not
    judged (another distribution in the namespace), and nothing of the tree is imported."""
    tree = megatron_tree(branch)
    status, rows, report = _real(tree)
    assert status == 1
    version = {"main": "0.20.0", "dev": "0.19.0"}[branch]
    assert report["versions"] == {
        "megatron-core": f"megatron-core {version} (read from megatron/core/package_info.py in {tree}; "
        "no distribution metadata)"
    }
    assert {k.split(".", 1)[1] for k, r in rows.items() if r["verdict"] == "install"} == CPU_INSTALLS
    assert rows["megatron-cpu.rope_forward_on_cpu"]["verdict"] == "not needed"
    assert "megatron-bridge" in report["untouched"]
    changed = {k: r["path"].partition(":")[2] for k, r in rows.items() if r["verdict"] == "changed"}
    if branch == "main":
        assert changed == CHANGED["main"]
    else:
        assert set(changed) == {k for k, r in rows.items() if k.startswith("megatron-mtp") and r["path"]}
        assert rows["megatron-mtp-fixups.packed_padded_roll"]["body"].startswith(
            "cannot read the upstream body of _roll_tensor_packed_seq"
        )
    assert all(r["diff"] for r in rows.values() if r["verdict"] == "changed")
    assert _imported_from(tree) == []


def test_the_018_wheel_from_019(megatron_tree: Callable[..., Path], from_0192: None) -> None:
    """The 0.18.2 wheel, judged from the installed 0.19.2: its MTP bodies are the ones verified for 0.18.2, only those
    verified solely for other releases are named, and the CPU shims install."""
    from scripts.source_tree import REPO, wheel

    megatron_tree("0.18.2")  # the wheel is downloaded once, into .cache/wheels
    status, rows, report = _real(wheel("megatron-core==0.18.2", REPO / ".cache" / "wheels"))
    assert status == 1
    assert report["versions"]["megatron-core"].startswith(
        "megatron-core 0.18.2 (read from megatron/core/package_info.py"
    )
    assert {k: r["path"].partition(":")[2] for k, r in rows.items() if r["verdict"] == "changed"} == CHANGED["0.18.2"]
    assert rows["megatron-mtp.postprocess"]["body"].startswith("verified against this body (GPTModel._postprocess, ")
    assert {k.split(".", 1)[1] for k, r in rows.items() if r["verdict"] == "install"} == CPU_INSTALLS


def test_a_requirement_is_downloaded_with_pip(
    megatron_tree: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, from_0192: None
) -> None:
    """``--against megatron-core==0.18.2`` fetches the wheel with pip download (here from the cached wheel, offline)."""
    from scripts.source_tree import REPO

    megatron_tree("0.18.2")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(REPO / ".cache" / "wheels"))
    status, rows, report = _real("megatron-core==0.18.2")
    assert status == 1
    assert report["versions"]["megatron-core"].startswith(
        "megatron-core 0.18.2 (read from megatron/core/package_info.py in megatron-core==0.18.2"
    )
    assert {k for k, r in rows.items() if r["verdict"] == "changed"} == set(CHANGED["0.18.2"])
    assert os.environ["PIP_NO_INDEX"] == "1"
