#!/usr/bin/env bash
# The user's route (`make test-user-route`): what `pip install patchreg` gives, away from the checkout.
#
# 1. Build the sdist and the wheel (python -m build, in a small venv) and check what they hold: LICENSE, py.typed,
#    the entry points, the metadata (license, classifiers), no tests.
# 2. Install the wheel into a fresh venv with the core dependencies only, and run everything from a directory
#    outside the checkout, without PYTHONPATH: `import patchreg` imports no torch; a patch set of one's own on the
#    standard library works as a context manager, a decorator and under the pytest plugin; `patchreg list` and
#    `patchreg doctor` exit 0; a shipped predicate answers no without torch; a `patches/` of one's own is named.
# 3. Add megatron-core and torch from the registry (the versions .venv has: pip's cache serves them where it has
#    them) and run the demo, verify_mtp and the README's tour from the installed package (the tour is read from the
#    installed distribution's own metadata), then `patchreg doctor` again.
#
# Variables: PY312 (the interpreter), USER_ROUTE_DIR (work directory, default .cache/user-route; emptied first),
# USER_ROUTE_STACK (what step 3 adds).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY312=${PY312:-python3.12}
WORK=${USER_ROUTE_DIR:-$ROOT/.cache/user-route}
STACK=${USER_ROUTE_STACK:-"megatron-core==0.19.2 torch==2.14.0"}
START=$SECONDS

say() { echo "user-route [$((SECONDS - START)) s]: $*"; }
fail() { echo "user-route: FAILED: $*" >&2; exit 1; }

rm -rf "$WORK"
mkdir -p "$WORK/dist"
HOME_DIR=$(mktemp -d "${TMPDIR:-/tmp}/patchreg-user-XXXXXX")  # the user's project: outside the checkout
trap 'rm -rf "$HOME_DIR"' EXIT
unset PYTHONPATH PATCHREG_PATCHSETS PATCHREG_DISABLE

say "building the sdist and the wheel from a copy of the checkout's files (tracked and not ignored)"
"$PY312" - "$ROOT" "$WORK/src" <<'EOF'  # what a clean clone holds (and local edits): nothing built, nothing ignored
import shutil, subprocess, sys
from pathlib import Path

root, dest = Path(sys.argv[1]), Path(sys.argv[2])
listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                        capture_output=True, check=True).stdout.decode().split("\0")
for name in filter(None, listed):
    if (root / name).is_file():  # a deleted file stays listed until it is committed
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)
EOF
"$PY312" -m venv "$WORK/build-venv"
"$WORK/build-venv/bin/python" -m pip install -q build
"$WORK/build-venv/bin/python" -m build --outdir "$WORK/dist" "$WORK/src" > "$WORK/build.log" 2>&1 \
    || { tail -n 30 "$WORK/build.log"; fail "python -m build failed (log: $WORK/build.log)"; }
"$WORK/build-venv/bin/python" - "$WORK/dist" <<'EOF' || fail "the sdist or the wheel does not hold what it should"
"""What the sdist and the wheel hold: every problem on its own line, exit 1 when there is one."""
import sys, tarfile, zipfile
from email.parser import Parser
from pathlib import Path

dist = Path(sys.argv[1])
(wheel,), (sdist,) = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
problems = []
names = zipfile.ZipFile(wheel).namelist()
info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
read = lambda name: zipfile.ZipFile(wheel).read(f"{info}/{name}").decode()
meta = Parser().parsestr(read("METADATA"))
if f"{info}/licenses/LICENSE" not in names:
    problems.append("the wheel has no LICENSE (dist-info/licenses/LICENSE)")
elif "Apache License" not in read("licenses/LICENSE"):
    problems.append("the wheel's LICENSE is not the Apache-2.0 text")
if meta["License-Expression"] != "Apache-2.0" or meta.get_all("License-File") != ["LICENSE"]:
    problems.append(f"metadata: License-Expression {meta['License-Expression']!r}, License-File {meta.get_all('License-File')}")
if not [c for c in meta.get_all("Classifier") or [] if c.startswith("Programming Language :: Python :: 3.")]:
    problems.append("metadata: no Python version classifiers")
if "patchreg/py.typed" not in names:
    problems.append("the wheel has no patchreg/py.typed")
entry_points = read("entry_points.txt")
for needed in ("[console_scripts]", "patchreg = patchreg.__main__:main", "[pytest11]", "[patchreg.patchsets]",
               "verl-mtp = patches.verl.mtp:VERL_MTP", "[vllm.general_plugins]", "[verl.plugins]"):
    if needed not in entry_points:
        problems.append(f"entry_points.txt has no {needed!r}")
tops = sorted({n.split("/")[0] for n in names} - {info})
if tops != ["patches", "patchreg"]:
    problems.append(f"the wheel's top-level entries are {tops}, not ['patches', 'patchreg']")
stray = [n for n in names if "/tests/" in f"/{n}" or Path(n).name.startswith("test_")]
members = tarfile.open(sdist).getnames()
root = members[0].split("/")[0]
stray += [m for m in members if m.startswith(f"{root}/tests/") or Path(m).name.startswith("test_")]
problems += [f"stray test file: {n}" for n in stray]
for needed in ("LICENSE", "PKG-INFO", "pyproject.toml", "README.md", "patchreg/py.typed"):
    if f"{root}/{needed}" not in members:
        problems.append(f"the sdist has no {needed}")
print("\n".join(problems) or f"contents ok: {wheel.name} ({len(names)} files), {sdist.name} ({len(members)} entries)")
sys.exit(1 if problems else 0)
EOF
WHEEL=$(ls "$WORK"/dist/*.whl)

say "a fresh venv with the wheel and the core dependencies only"
"$PY312" -m venv "$WORK/venv"
PY=$WORK/venv/bin/python
"$PY" -m pip install -q "$WHEEL"
cd "$HOME_DIR"  # away from the checkout: nothing of it is on sys.path, no pytest config of it applies
"$PY" - <<'EOF' || fail "import patchreg imported a heavy library, or not from the venv"
import sys
import patchreg
heavy = sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "megatron", "vllm", "verl"))
assert not heavy, f"import patchreg imported {heavy[:5]}"
assert patchreg.__file__.startswith(sys.prefix), f"patchreg comes from {patchreg.__file__}, not the venv"
print(f"import patchreg: no torch, from {patchreg.__file__}")
EOF
cat > user_sets.py <<'EOF'
"""A user's own patch set, on the standard library."""
from patchreg import Patch, PatchSet, requires


def compact(wrapped, instance, args, kwargs):
    return wrapped(*args, **{**kwargs, "separators": (",", ":")})


COMPACT = PatchSet("user-compact-json", [Patch("compact", "json:dumps", compact, kind="wrap", when=requires("attrs"))],
                   doc="json.dumps without spaces, for a block")
EOF
"$PY" - <<'EOF' || fail "the user's patch set did not work as a context manager and a decorator"
import json
from patchreg import registry
from user_sets import COMPACT

original = json.dumps
with registry.patched(COMPACT):
    assert json.dumps({"a": [1, 2]}) == '{"a":[1,2]}'
assert json.dumps is original and json.dumps({"a": 1}) == '{"a": 1}'


@registry.patched(COMPACT)
def encode(value):
    return json.dumps(value)


assert encode({"a": 1}) == '{"a":1}' and json.dumps is original and registry.active() == ()
print("the user's set: context manager and decorator, restored exactly")
EOF
"$PY" -m pip install -q pytest
cat > test_user_sets.py <<'EOF'
import json

import patchreg
from user_sets import COMPACT


def test_the_plugins_fixture(patch_registry):
    with patch_registry.patched(COMPACT):
        assert json.dumps({"a": 1}) == '{"a":1}'


def test_a_leak_is_caught_by_the_plugin():
    patchreg.apply(COMPACT)  # never reverted: the plugin's leak guard fails this test and reverts it
EOF
"$PY" -m pytest -q -rA -p no:cacheprovider test_user_sets.py > pytest.log 2>&1 && fail "the leak guard did not run"
grep -q "^PASSED test_user_sets.py::test_the_plugins_fixture" pytest.log \
    && grep -q "^ERROR test_user_sets.py::test_a_leak_is_caught_by_the_plugin - Failed: test left patches active" \
        pytest.log || { cat pytest.log; fail "the pytest plugin (fixture, leak guard) did not behave"; }
say "the pytest plugin: its fixture works, its leak guard fails a leaking test"
"$WORK/venv/bin/patchreg" list > list.txt || fail "patchreg list exited $?"
"$WORK/venv/bin/patchreg" doctor > doctor.txt || { cat doctor.txt; fail "patchreg doctor is red in a core-only venv"; }
"$PY" -m patchreg -m user_sets doctor > doctor-user.txt || { cat doctor-user.txt; fail "doctor -m user_sets"; }
grep -q "^user-compact-json  *compact  *yes" doctor-user.txt || { cat doctor-user.txt; fail "doctor did not check the user's set"; }
"$WORK/venv/bin/patchreg" show megatron-mtp.postprocess > show.txt || fail "patchreg show exited $?"
grep -q "^answer  *no: " show.txt || { cat show.txt; fail "a shipped predicate did not answer no without torch"; }
for out in list.txt doctor.txt doctor-user.txt show.txt; do
    awk -v f="$out" 'length > 100 { print f ": " length " columns: " $0; bad = 1 } END { exit bad }' "$out" \
        || fail "$out is wider than 100 columns"
done
tail -n 1 doctor.txt
mkdir -p shadow/patches && touch shadow/patches/__init__.py  # a project with a patches/ of its own
(cd shadow && "$PY" -m patchreg doctor > ../shadow.txt) && fail "doctor passed with patches/ shadowing ours"
tr -d '\n ' < shadow.txt | grep -qF "'patches'is'$(cd shadow && pwd -P)/patches'" \
    || { cat shadow.txt; fail "doctor did not name the folder that shadows ours"; }
rm -rf shadow
say "core only: list, doctor (exit 0), show, a shadowing patches/ named"

say "adding $STACK from the registry"
STACK_START=$SECONDS
# shellcheck disable=SC2086  # the stack is a list of requirements
"$PY" -m pip install -q $STACK
say "installed in $((SECONDS - STACK_START)) s"
export HF_HUB_OFFLINE=1
"$PY" -m patches.megatron.demo > demo.txt 2>&1 || { cat demo.txt; fail "python -m patches.megatron.demo"; }
LINES=$(wc -l < demo.txt)
[ "$LINES" -le 40 ] || { cat demo.txt; fail "the demo printed $LINES lines (at most 40)"; }
grep -q "bit-equal to a never-patched twin's" demo.txt || { cat demo.txt; fail "the demo's twin check"; }
say "demo ok ($LINES lines)"
"$PY" -m patches.megatron.demo --verify > verify.txt 2>&1 || { cat verify.txt; fail "verify_mtp on the demo's model"; }
say "verify_mtp ok"
"$PY" - > tour.py <<'EOF'
import importlib.metadata
import re

readme = importlib.metadata.metadata("patchreg").get_payload()  # the README, as the wheel carries it
print(re.search(r"```python\n(.*?)```", readme.split("## A tour", 1)[1], flags=re.DOTALL).group(1))
EOF
"$PY" tour.py > tour.txt 2>&1 || { cat tour.txt; fail "the README's tour"; }
grep -q "mtp_patched(detach_encoder=True) on GPTModel" tour.txt || { cat tour.txt; fail "the tour's report"; }
say "the README's tour ok"
"$WORK/venv/bin/patchreg" doctor > doctor-megatron.txt || { cat doctor-megatron.txt; fail "doctor with Megatron"; }
tail -n 1 doctor-megatron.txt
say "ok: the user's route is green ($((SECONDS - START)) s)"
