#!/usr/bin/env bash
# The megatron-core version matrix (make test-matrix): tests/megatron and the engine tests on every
# supported release except the default lane's 0.19.2 (make test). One environment per Python; the
# release under test is an overlay (pip --no-deps --target .matrix/<ver>) put first on PYTHONPATH.
#   0.13.1-0.16.1: .venv-py311 (Python 3.11, CPU torch; 0.15 JIT-builds a CUDA extension under a CUDA torch)
#   0.17.1, 0.18.2: .venv (Python 3.12, the default lane's environment)
# `scripts/test-matrix.sh --overlay <release>` only makes that release's overlay (for make bench-release).
# Environment: MATRIX_RELEASES="0.17.1 0.18.2" to run a subset (0.19.2 runs on .venv without overlay),
# MATRIX_OUT=<dir> for the logs and measurements (default .matrix),
# PY311 / PY312 to use other interpreters, PYTEST_ARGS for extra pytest arguments.
# The summary (scripts/matrix_summary.py) is read from what the tests write to $PATCHREG_MEASUREMENTS.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RELEASES=${MATRIX_RELEASES:-"0.13.1 0.14.0 0.15.3 0.16.1 0.17.1 0.18.2"}
VENV311=$ROOT/.venv-py311
PY311=${PY311:-$VENV311/bin/python}
PY312=${PY312:-$ROOT/.venv/bin/python}
TORCH_CPU_REQ=${TORCH_CPU_REQ:-torch==2.13.0+cpu}
MATRIX=$ROOT/.matrix
OUT=${MATRIX_OUT:-$MATRIX}  # logs and measurements (MATRIX_OUT: elsewhere, e.g. when .matrix is shared)
mkdir -p "$MATRIX" "$OUT"

say() { printf '%s\n' "$*" >&2; }

python_for() {  # the interpreter a release runs on
    case "$1" in
        0.13.* | 0.14.* | 0.15.* | 0.16.*) echo "$PY311" ;;
        *) echo "$PY312" ;;
    esac
}

ensure_py311() {  # create the Python 3.11 CPU environment when it is missing
    [ -x "$PY311" ] && return 0
    local base
    base=$(ls -d /root/.pyenv/versions/3.11*/bin/python3.11 2>/dev/null | tail -n 1)
    base=${base:-$(command -v python3.11)}
    [ -n "$base" ] || { say "no python3.11 found; set PY311"; return 1; }
    say "creating $VENV311 with $base"
    "$base" -m venv "$VENV311" &&
        "$PY311" -m pip install -q "$TORCH_CPU_REQ" numpy &&
        "$PY311" -m pip install -q -e ".[test]"
}

ensure_overlay() {  # .matrix/<ver> holding megatron-core <ver> only
    local ver=$1 py=$2 dir=$MATRIX/$1
    [ -f "$dir/.complete" ] && return 0
    rm -rf "$dir"
    "$py" -m pip install -q --no-deps --target "$dir" "megatron-core==$ver" && touch "$dir/.complete"
}

run_release() {  # pytest for one release; prints nothing but pytest's tail, returns its status
    local ver=$1 py overlay=""
    py=$(python_for "$ver")
    if [ "$ver" != "0.19.2" ]; then
        ensure_overlay "$ver" "$py" || { say "cannot install megatron-core==$ver"; return 1; }
        overlay=$MATRIX/$ver
    fi
    local found
    found=$(PYTHONPATH=$overlay "$py" -c 'import importlib.metadata as m; print(m.version("megatron-core"))' 2>/dev/null)
    [ "$found" = "$ver" ] || { say "overlay for $ver reports megatron-core ${found:-none}"; return 1; }
    rm -f "$OUT/$ver.measurements.jsonl"
    local suite status=0
    for suite in megatron patchreg; do
        PYTHONPATH=$overlay PATCHREG_MEASUREMENTS=$OUT/$ver.measurements.jsonl \
            "$py" -m pytest "tests/$suite" -m "not slow" -q -p no:cacheprovider ${PYTEST_ARGS:-} \
            >"$OUT/$ver.$suite.log" 2>&1
        local rc=$?
        SUITES+=("$suite $([ $rc = 0 ] && echo pass || echo FAIL)")
        [ $rc = 0 ] || status=1
        tail -n 1 "$OUT/$ver.$suite.log" >&2
    done
    return $status
}

measured() {  # per model class: max abs diff of logits / MTP grads vs the reference, RL-mode parity, patches
    "$PY312" "$ROOT/scripts/matrix_summary.py" "$OUT/$1.measurements.jsonl" 2>/dev/null || echo "    -"
}

if [ "${1:-}" = "--overlay" ]; then  # only make the overlay of one release of .venv's Python (make bench-release)
    [ -n "${2:-}" ] || { say "usage: scripts/test-matrix.sh --overlay <release>"; exit 2; }
    ensure_overlay "$2" "$PY312" || { say "cannot install megatron-core==$2"; exit 1; }
    exit 0
fi

case " $RELEASES " in *" 0.13."* | *" 0.14."* | *" 0.15."* | *" 0.16."*) ensure_py311 || exit 1 ;; esac

failed=0
summary=()
for ver in $RELEASES; do
    say "=== megatron-core $ver ($(python_for "$ver"))"
    start=$SECONDS
    SUITES=()
    if run_release "$ver"; then result=pass; else result=FAIL; failed=1; fi
    detail=$(IFS=,; echo "${SUITES[*]:-setup failed}")
    summary+=("$(printf '  %-8s %-5s %4ss  [%s]' "$ver" "$result" "$((SECONDS - start))" "$detail")")
    summary+=("$(measured "$ver")")
done

say ""
say "megatron-core matrix (logs in $OUT/<ver>.<suite>.log); per release x model class: max abs diff of the"
say "logits and MTP gradients vs the reference, upstream RL-mode (labels=None) parity, patches installed/skipped:"
for line in "${summary[@]}"; do say "$line"; done
exit $failed
