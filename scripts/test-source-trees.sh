#!/usr/bin/env bash
# Source trees (make test-source-trees): the Megatron tests on Megatron-Core as RL users run it, from a tree on
# PYTHONPATH with no megatron-core distribution metadata importable:
#   main, dev   the Megatron-LM snapshots (test data; never in the repository), unpacked
#   0.18.2, 0.19.2   the released wheels (pip download --no-deps, once), unpacked without their .dist-info
# each in a view of .venv without megatron-core (scripts/source_tree.py venv: site-packages symlinked, its files and
# metadata left out); then main over .venv's installed 0.19.2 metadata (an overlay: the report must name 0.20.0).
# The snapshots are looked up in $PATCHREG_UPSTREAM_DIR, else <repo>/../shared/upstream, else /work/shared/upstream;
# without them the lane fails (it never skips a tree).
# Environment: SOURCE_TREES="main dev 0.18.2 0.19.2 main-overlay" to run a subset, SOURCE_TREES_OUT=<dir> for the
# logs and measurements (default .cache/source-trees), SOURCE_TREES_PYTHON for another .venv python, PYTEST_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${SOURCE_TREES_PYTHON:-$ROOT/.venv/bin/python}  # the environment the lane views without megatron-core
WORK=$ROOT/.cache/source-trees
OUT=${SOURCE_TREES_OUT:-$WORK}
TREES=${SOURCE_TREES:-"main dev 0.18.2 0.19.2 main-overlay"}
# The guarantees on GPTModel and HybridModel (logits, MTP gradients, detach_encoder, the padded pack, labels=None,
# recompute, restoring upstream, the report), the native route against today's patches, the CPU shims, doctor, and
# the issue-41 rows (test_source_trees.py). The overlay run needs only the rows.
TESTS=(tests/megatron/test_source_trees.py tests/megatron/test_families.py tests/megatron/test_fixups.py
    tests/megatron/test_native_route.py tests/megatron/test_mtp.py tests/megatron/test_hybrid.py
    tests/megatron/test_cpu.py tests/megatron/test_doctor.py tests/megatron/test_compat.py tests/megatron/test_native.py
    tests/megatron/test_verify.py)
OVERLAY_TESTS=(tests/megatron/test_source_trees.py)
mkdir -p "$WORK" "$OUT"

say() { printf '%s\n' "$*" >&2; }

upstream_dir() {  # the first of the places that holds both Megatron-LM snapshots (scripts/source_tree.py's PLACES)
    "$PY" "$ROOT/scripts/source_tree.py" upstream && return 0
    say "test-source-trees: the lane does not skip a tree."
    return 1
}

tree_dir() {  # unpack a tree once: .cache/source-trees/<name> (a snapshot, or a wheel without its .dist-info)
    local name=$1 dir=$WORK/trees/$1 archive
    if [ ! -f "$dir/.complete" ]; then
        rm -rf "$dir"
        case "$name" in
            main | dev) archive=$("$PY" scripts/source_tree.py snapshot "$name") || return 1 ;;
            *) archive=$("$PY" scripts/source_tree.py wheel "megatron-core==$name" --cache "$ROOT/.cache/wheels") || return 1 ;;
        esac
        "$PY" scripts/source_tree.py unpack "$archive" "$dir" >/dev/null && touch "$dir/.complete" || return 1
    fi
    echo "$dir"
}

# What a run imports: megatron.core's file, and the megatron-core metadata importlib finds (none, or a version).
IMPORTED='import importlib.metadata as m, megatron.core as c
try:
    found = m.version("megatron-core")
except m.PackageNotFoundError:
    found = "none"
print(c.__file__, found)'

NAMED='import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if "imported version" in line]
for row in rows:
    print("    %s: the tree says %s, the metadata %s" % (row["key"], row["value"]["tree"], row["value"]["metadata"]))'

run_tree() {  # pytest on one tree; prints pytest's last line; returns its status
    local name=$1 python=$NOMETA tree want_meta=none tests=("${TESTS[@]}")
    case "$name" in
        main-overlay) tree=$(tree_dir main) || return 1; python=$PY; want_meta=0.19.2; tests=("${OVERLAY_TESTS[@]}") ;;
        *) tree=$(tree_dir "$name") || return 1 ;;
    esac
    local seen
    seen=$(PYTHONPATH=$tree "$python" -W ignore -c "$IMPORTED" 2>/dev/null | tail -n 1)
    case "$seen" in
        "$tree/megatron/core/__init__.py $want_meta") ;;
        *) say "test-source-trees: $name imports '${seen:-nothing}', not $tree's megatron.core with metadata $want_meta"
           return 1 ;;
    esac
    rm -f "$OUT/$name.measurements.jsonl"
    local home
    home=$(mktemp -d)
    HOME=$home PYTHONPATH=$tree:$ROOT PATCHREG_MEASUREMENTS=$OUT/$name.measurements.jsonl \
        "$python" -m pytest "${tests[@]}" -m "not slow" -q -p no:cacheprovider --continue-on-collection-errors ${PYTEST_ARGS:-} >"$OUT/$name.log" 2>&1
    local rc=$?
    rm -rf "$home"
    tail -n 1 "$OUT/$name.log" >&2
    return $rc
}

UPSTREAM=$(upstream_dir) || exit 1
NOMETA=$("$PY" scripts/source_tree.py venv "$WORK/venv-without-megatron-core" --without megatron-core) || {
    say "test-source-trees: cannot make a view of $PY's environment without megatron-core"
    exit 1
}

failed=0
summary=()
for name in $TREES; do
    say "=== $name"
    start=$SECONDS
    if run_tree "$name"; then result=pass; else result=FAIL; failed=1; fi
    summary+=("$(printf '  %-13s %-5s %4ss  (log: %s)' "$name" "$result" "$((SECONDS - start))" "$OUT/$name.log")")
    if [ "$name" = main-overlay ]; then  # what the report names: the tree's version, over the installed metadata
        summary+=("$("$PY" -c "$NAMED" "$OUT/$name.measurements.jsonl" 2>/dev/null || echo "    -")")
    else
        summary+=("$("$PY" scripts/matrix_summary.py "$OUT/$name.measurements.jsonl" 2>/dev/null || echo "    -")")
    fi
done

say ""
say "source trees (snapshots from $UPSTREAM; no megatron-core metadata except main-overlay's 0.19.2): per tree x"
say "model class, max abs diff of logits and MTP grads vs the reference, the route, patches installed/skipped:"
for line in "${summary[@]}"; do say "$line"; done
exit $failed
