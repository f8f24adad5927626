"""Shipped predicates where an optional package is missing: each answers no with the reason, none raises.

Each case runs in a fresh interpreter (``python -S``) whose path is a view of this environment's site-packages
without the named distributions (their packages and their metadata): to it they are not installed. The CI lane
``make test-user-route`` checks the same in a fresh venv that has none of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json
from patchreg._discovery import KNOWN_MODULES, discover
found = discover((*KNOWN_MODULES, "patches.megatron.bridge", "patches.verl.mtp"))
rows, raised = [], []
for f in found.sets:
    for p in f.patch_set:
        try:
            a = p.when.evaluate()
        except Exception as exc:
            raised.append(f"{f.name}.{p.name}: {exc}")
        else:
            rows.append([f.name, p.name, a.ok, a.needed, a.reason])
print(json.dumps({"rows": rows, "raised": raised, "errors": [e.reason for e in found.errors]}))
"""


def _without(blocked: str, code: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in ``python -S`` over a view of site-packages without the ``blocked`` distributions."""
    names = {canonicalize_name(b) for b in blocked.split(",")}
    view = tmp / "site"
    view.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if canonicalize_name(entry.name.split("-")[0].removesuffix(".py")) not in names:
            (view / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHREG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(view), str(ROOT)])
    cmd = [sys.executable, "-S", "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp)


def _evaluate(blocked: str, tmp: Path) -> dict[str, list[list[object]]]:
    """Every shipped patch's answer where the ``blocked`` distributions are not installed."""
    result = _without(blocked, CHILD, tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


CORE = "torch,megatron,megatron-core,vllm,verl,transformer-engine"  # the engine's dependencies only


def test_no_shipped_predicate_raises_for_a_missing_package(tmp_path: Path) -> None:
    """With torch, Megatron, vLLM and verl missing, every shipped predicate answers (none raises), every set loads."""
    out = _evaluate(CORE, tmp_path)
    assert out["raised"] == []
    assert out["errors"] == []
    assert len(out["rows"]) > 60


def test_without_torch_no_patch_is_called_not_needed(tmp_path: Path) -> None:
    """Without torch, Megatron, vLLM and verl every shipped patch answers no as needed (never "not needed here"
    about a release it cannot see), with a reason naming what is missing."""
    rows = _evaluate(CORE, tmp_path)["rows"]
    assert rows and [r for r in rows if r[2] or not r[3]] == []
    reasons = " ".join(str(r[4]) for r in rows)
    assert "torch is not installed" in reasons and "megatron-core is not installed" in reasons


def test_show_of_a_shipped_patch_without_torch_answers_no(tmp_path: Path) -> None:
    """`patchreg show megatron-mtp.postprocess` without torch exits 0 and answers no, naming what is missing."""
    code = "import sys\nfrom patchreg.__main__ import main\nsys.exit(main(['show', 'megatron-mtp.postprocess']))\n"
    result = _without(CORE, code, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = next(line for line in result.stdout.splitlines() if line.startswith("answer"))
    assert answer.split()[1] == "no:" and "raised" not in result.stdout, result.stdout
