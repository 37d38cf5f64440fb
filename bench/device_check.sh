#!/usr/bin/env bash
# The GPU checks in one call of at most 540 s, for a session lent a GPU machine for a few
# minutes (issue "The cache on a real GPU"; docs/benchmarks.md, "On a GPU machine"). Steps, in
# priority order, each with a time limit of its own; a failed step does not stop the next:
#   probe  (25 s)  device, torch, CUDA, Triton; pinned copy GB/s; random 64/128/512-byte host
#                  rows through the unified view (and a Triton gather); sorts of 426 k / 3.5 M ids
#   install (30 s) the package into a venv over the machine's own Python and torch
#                  (--system-site-packages), `pip install --no-deps`, then `embcache --help` from it (issue
#                  "Installs where its users already are"): the wheel in dist/ where one was carried
#                  (nothing to build: the machine has no network, and perhaps no `wheel` for its
#                  setuptools), else `-e .` (--no-build-isolation). Make the wheel just before the call:
#                  `make wheel` (a clean build/: nothing stale rides along), carry ["dist"]; a wheel
#                  of other code than the checkout's is refused, said, and the install made editable
#   cuda   (75+95 s) pytest -m cuda: both bookkeepers and the unified view, then the rest of tests/
#                  (the Triton kernels against torch, the captured step against the eager one), from that
#                  install where it succeeded (else from the folder), summarised in cuda_tests.json
#   graphs (120 s) bench gpu --cuda-graphs on, one-hot, batch 65,536, bf16: the whole table with Triton's
#                  kernels and the cache at 1.5 % with the device bookkeeper, each step captured as one
#                  CUDA graph (the cached one prefetching the next batch inside it; a process of its own: a
#                  failed capture cannot cost the other steps' rows), against the whole table's eager torch
#                  step (issue targets: 6 M and 4 M samples/s), with the captured steps' profiles
#   gpu    (100 s) bench gpu at Kaggle cardinalities, dim 128, one-hot, batch 65,536, bf16, eager, no
#                  profile: the whole table (torch's and Triton's kernels) against the cache at 1.5 %, device
#                  bookkeeping with Triton's kernels, and host bookkeeping
#   kernels (35 s) bench kernels: Triton's lookup and fused backward + Adagrad against torch's sparse
#                  path, one-hot and multi-hot, batch 65,536, at a quarter of Kaggle's rows
#   multi  (45 s)  bench gpu multi-hot (MLPerf pooling), batch 16,384, a 5 % cache (holds a batch's
#                  distinct rows), device bookkeeping with Triton's kernels against host bookkeeping
# The limits add up to the budget with the header's ~13 s (on 2026-11-28 they did not: the last
# steps got what was left). Each bench writes its JSON after every variant (row), so a step cut
# by its limit keeps the rows it finished.
#   host   (50 s)  bench host on every core: the measured host ceiling (run it when time is left)
# Optional: cf (HEAT on every core against the torch engine on the GPU, MovieLens-100k; measured
# on an H200 on 2026-11-27), nccl (a 1-rank torchrun DLRM on NCCL) and suite (the default tests).
# Everything lands in $OUT (the device tool's folder; here by default bench/results/device):
# one JSON per step (probe.json, cuda_tests.json, gpu.json + gpu.png, gpu_multi.json + .png,
# kernels.json, gpu_graphs.json + .png, cf_device.json, host_device.json + .png) and one log,
# device_check.log: 14 files at most.
#
# Nothing is installed: the repository runs from its folder (PYTHONPATH), on the machine's
# own torch, numba, pyarrow and pytest; torchrec is not needed (the plain-torch DLRM).
# MovieLens-100k must be fetched here first and carried (the device machine reaches no
# network): `.venv/bin/python -c 'from embcache.data.movielens import ml100k_dir; ml100k_dir()'`,
# then the device tool's run with carry ["datasets/ml-100k"].
#
#   bash bench/device_check.sh                # probe install cuda graphs gpu kernels multi, in that order
#   bash bench/device_check.sh probe gpu      # some of them
#   bash bench/device_check.sh cf nccl suite  # the optional steps
#   SMALL=1 bash bench/device_check.sh        # the same steps at toy sizes, on the CPU too
#   BUDGET=480 bash bench/device_check.sh     # the whole call's seconds (default 540): a step gets at
#                                             # most what is left; one with under 20 s left is skipped
#   SMALL=1 PYTHONPATH=bench/as_on_the_gpu_machine bash bench/device_check.sh  # ... without torchrec and faiss, as there
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STEPS=" ${*:-probe install cuda graphs gpu kernels multi} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
for s in $STEPS; do
    case "$s" in probe|install|cuda|gpu|multi|kernels|graphs|cf|host|nccl|suite) ;;
        *) echo "device_check: unknown step '$s' (probe install cuda gpu multi kernels graphs cf host nccl suite)"
           exit 2;; esac
done
OUT="${OUT:-bench/results/device}"
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
PY="${PYTHON:-python3}"
CORES="$(nproc)"
SMALL="${SMALL:-}"
HAVE_CUDA="$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)"
DEV=$([ "$HAVE_CUDA" = 1 ] && echo cuda || echo cpu)
# without a GPU (SMALL=1 here), Triton's interpreter runs the embedding kernels on CPU tensors
[ "$HAVE_CUDA" = 1 ] || export TRITON_INTERPRET=1
T0=$SECONDS

BUDGET="${BUDGET:-540}"  # seconds for the whole call: a step gets at most what is left, none under 20 s
step() {  # step NAME SECONDS COMMAND...: run with a limit, log its output and status
    local name="$1" limit="$2"; shift 2
    local left=$((BUDGET - (SECONDS - T0)))
    if [ "$left" -lt 20 ]; then
        echo "=== $name: skipped, ${left}s of the ${BUDGET}s budget left" | tee -a "$LOG"; return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit}s, at ${SECONDS}s): $*" | tee -a "$LOG"
    local start=$SECONDS
    timeout --kill-after=5 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$LOG"
}

{
    echo "device_check $(date -u +%FT%TZ) on $(hostname): $CORES cores, device $DEV"
    nvidia-smi -L 2>/dev/null || true
    "$PY" -c 'import sys, torch, numba, numpy, pyarrow; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "numba", numba.__version__, "numpy", numpy.__version__, "pyarrow", pyarrow.__version__)'
    git log -1 --format='commit %H %s' 2>/dev/null || true
} >"$LOG" 2>&1
cat "$LOG"

if [ -n "$SMALL" ]; then
    PROBE_ARGS=(--table-mib 16 --rows 4096 --batch-size 512)
    # (Triton's interpreter runs each kernel program in Python here: batches of a few dozen)
    GPU_ARGS=(--scale 0.002 --dims 16 --batch-size 32 --steps 2 --warmup-steps 1 --no-profile --link-table-mib 16)
    MULTI_ARGS=(--scale 0.002 --dims 16 --batch-size 4 --steps 2 --warmup-steps 1 --no-profile --link-table-mib 16)
    KERNEL_ARGS=(--scale 0.0002 --dim 8 --batch-sizes 8 --steps 1 --warmup-steps 0 --copy-mib 4)
    CF_ARGS=(--ml-epochs 1 --ml-negatives 64 --cost-epochs 1)
    HOST_ARGS=(--scale 0.01 --steps 2 --warmup-steps 1 --threads 1 "$CORES")
    DLRM_STEPS=5
else
    PROBE_ARGS=(--table-mib 2048 --rows 1048576)
    GPU_ARGS=(--scale 1.0 --dims 128 --batch-size 65536 --steps 15 --warmup-steps 5 --link-table-mib 2048)
    MULTI_ARGS=(--scale 1.0 --dims 128 --batch-size 16384 --steps 10 --warmup-steps 3 --link-table-mib 2048)
    KERNEL_ARGS=(--scale 0.25 --dim 128 --batch-sizes 65536 --steps 10 --warmup-steps 3 --copy-mib 2048)
    CF_ARGS=(--ml-epochs 3 --ml-negatives 64 1000 --cost-epochs 1)
    HOST_ARGS=(--steps 4 --warmup-steps 3 --threads 1 4 "$CORES")
    DLRM_STEPS=60
fi

# 1. the device and the link, through what a device-side cache uses
want probe && step "probe" 25 "$PY" -m embcache bench probe --device "$DEV" --out "$OUT" --name probe "${PROBE_ARGS[@]}"
# 2. the package installed over the machine's own torch (a carried wheel: nothing to build; else
#    editable: no copy, no download): into a venv over the machine's packages, or, where such a
#    venv does not see its torch (a venv made over a venv sees the base's packages alone), into a
#    folder beside them (`pip install --target`; a wheel only)
INSTALLED=()  # the command that runs Python from the install, where it imports beside torch
if want install; then
    HERE="$(mktemp -d)"
    WHEEL="$(ls -t "$PWD"/dist/embcache-*.whl 2>/dev/null | head -1)" REPO="$PWD"
    # a wheel made from other code than this checkout's (left in dist/ from an earlier call) would
    # test that code: refused, said in the log, and the install made editable instead
    if [ -n "$WHEEL" ] && ! "$PY" - "$WHEEL" <<'EOF' 2>&1 | tee -a "$LOG"
import pathlib, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
inside = {n for n in wheel.namelist() if n.startswith("embcache/") and n.endswith(".py")}
here = {p.as_posix() for p in pathlib.Path("embcache").rglob("*.py")}
differ = sorted(n for n in inside & here if pathlib.Path(n).read_bytes() != wheel.read(n)) + sorted(inside ^ here)
if differ:
    print(f"=== install: {sys.argv[1]} is not this checkout's code ({len(differ)} files differ, the first "
          f"{differ[0]}): not installed; make the wheel just before the call")
    sys.exit(1)
EOF
    then WHEEL=""; fi
    case "$PY" in  # the same interpreter from another folder (a venv's link kept as it is)
        */*) PY_AT="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
        *) PY_AT="$(command -v "$PY")" ;;
    esac
    export PY_AT HERE WHEEL REPO
    step "install" 30 bash -c '
        pip_in() { local py="$1"; shift; "$py" -m pip install -q --no-deps --ignore-installed --no-build-isolation "$@"; }
        # (run from $HERE: from the checkout, its own folder would be imported first)
        report=(-c "import embcache, torch; print(\"installed\", embcache.__file__, \"beside torch\", torch.__version__)")
        cd "$HERE" || exit 1
        if "$PY_AT" -m venv --system-site-packages "$HERE/venv" && "$HERE/venv/bin/python" -c "import torch" 2>/dev/null; then
            pip_in "$HERE/venv/bin/python" ${WHEEL:-"-e" "$REPO"} && env -u PYTHONPATH "$HERE/venv/bin/embcache" --help >/dev/null &&
                env -u PYTHONPATH "$HERE/venv/bin/python" "${report[@]}"
        elif [ -n "$WHEEL" ]; then
            echo "a venv over $PY_AT does not see its torch: the wheel goes into $HERE/target, beside its packages"
            pip_in "$PY_AT" --target "$HERE/target" "$WHEEL" && PYTHONPATH="$HERE/target" "$HERE/target/bin/embcache" --help >/dev/null &&
                PYTHONPATH="$HERE/target" "$PY_AT" "${report[@]}"
        else
            echo "a venv over $PY_AT does not see its torch, and no wheel was carried (dist/) to install beside it"; exit 1
        fi'
    if [ -x "$HERE/venv/bin/embcache" ] && env -u PYTHONPATH "$HERE/venv/bin/python" -c 'import embcache, torch' 2>/dev/null; then
        INSTALLED=(env -u PYTHONPATH "$HERE/venv/bin/python")
    elif [ -x "$HERE/target/bin/embcache" ] && PYTHONPATH="$HERE/target" "$PY" -c 'import embcache, torch' 2>/dev/null; then
        INSTALLED=(env PYTHONPATH="$HERE/target" "$PY")
    fi
fi
# 3. the tests marked cuda (skipped without a GPU: then they say so), summarised as JSON; from the
#    install where it succeeded
if want cuda; then
    # two runs, each with its report: the bookkeepers' tests, then the kernels' and the graph's (Triton
    # compiles each kernel variant once), so that a run cut by its limit costs only its own report
    XML1="$(mktemp --suffix .xml)" XML2="$(mktemp --suffix .xml)"
    RUNNER=("$PY") && [ ${#INSTALLED[@]} -gt 0 ] && RUNNER=("${INSTALLED[@]}")
    step "pytest -m cuda, bookkeepers${INSTALLED[*]:+ (installed)}" 75 "${RUNNER[@]}" -m pytest -q -m cuda \
        -p no:cacheprovider --junitxml="$XML1" tests/test_cuda.py tests/test_unified_view.py
    step "pytest -m cuda, kernels and graphs${INSTALLED[*]:+ (installed)}" 95 "${RUNNER[@]}" -m pytest -q -m cuda \
        -p no:cacheprovider --junitxml="$XML2" tests --deselect tests/test_cuda.py --deselect tests/test_unified_view.py
    RAN_FROM="${INSTALLED[*]:+installed package}" "$PY" - "$XML1,$XML2" "$OUT/cuda_tests.json" <<'EOF' >>"$LOG" 2>&1
import json, sys, xml.etree.ElementTree as ET
cases, errors = [], []
for report in sys.argv[1].split(","):
    try:
        cases += list(ET.parse(report).getroot().iter("testcase"))
    except (ET.ParseError, OSError) as e:
        errors.append(f"no junit report {report}: {e}")
error = "; ".join(errors) or None
rows = []
for c in cases:
    outcome = next((k.tag for k in c if k.tag in ("failure", "error", "skipped")), "passed")
    msg = next((k.get("message", "") for k in c if k.tag in ("failure", "error", "skipped")), "")
    rows.append({"test": f"{c.get('classname')}::{c.get('name')}", "outcome": outcome, "seconds": float(c.get("time", 0)),
                 "message": msg[:500]})
counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failure", "error", "skipped")}
import os
ran_from = os.environ.get("RAN_FROM") or "the repository folder (PYTHONPATH)"
json.dump({"benchmark": "cuda_tests", "counts": counts, "error": error, "ran_from": ran_from, "tests": rows},
          open(sys.argv[2], "w"), indent=1)
print("cuda tests:", counts)
EOF
    rm -f "$XML1" "$XML2"
fi
# 4a. the step captured as one CUDA graph: the whole table with Triton's kernels and the cache at 1.5 %
#     with the device bookkeeper and Triton's kernels, against the whole table's eager torch step
want graphs && step "bench gpu graphs" 120 "$PY" -m embcache bench gpu --device "$DEV" --out "$OUT" --name gpu_graphs \
    --shapes one-hot --ratios 0.015 --bookkeeping device --kernels triton --precision bf16 --no-price-prefetch \
    --cuda-graphs on "${GPU_ARGS[@]}"
# 4b. DLRM on one GPU, eager, no profile: the cache at 1.5 % against the whole table on the device, one-hot,
#    batch 65,536, bf16; device bookkeeping with Triton's kernels, then host bookkeeping
want gpu && step "bench gpu" 100 "$PY" -m embcache bench gpu --device "$DEV" --out "$OUT" --name gpu --ratios 0.015 \
    --shapes one-hot --bookkeeping device host --kernels triton --precision bf16 --no-price-prefetch \
    --cuda-graphs off --no-profile "${GPU_ARGS[@]}"
# 4c. the embedding kernels alone against torch's sparse path
want kernels && step "bench kernels" 35 "$PY" -m embcache bench kernels --device "$DEV" --out "$OUT" --name kernels \
    "${KERNEL_ARGS[@]}"
# 4d. multi-hot at a cache that holds a batch's distinct rows
want multi && step "bench gpu multi-hot" 45 "$PY" -m embcache bench gpu --device "$DEV" --out "$OUT" \
    --name gpu_multi --ratios 0.05 --shapes multi-hot --bookkeeping device host --kernels triton --precision bf16 \
    --no-price-prefetch --cuda-graphs off --no-profile "${MULTI_ARGS[@]}"
# optional: HEAT on every core against the torch engine on the GPU, same data and settings
want cf && step "bench cf" 90 "$PY" -m embcache bench cf --datasets ml-100k --threads "$CORES" --torch-device "$DEV" \
    --no-baseline --no-old-rule --no-plot --out-dir "$OUT" --name cf_device "${CF_ARGS[@]}"
# 5. the cache's host ceiling on this machine's cores (measured, not projected)
want host && step "bench host" 50 "$PY" -m embcache bench host --ratios 0.015 --shapes one-hot multi-hot \
    --out "$OUT" --name host_device "${HOST_ARGS[@]}"
# optional: DLRM under torchrun, one rank (NCCL where the device is CUDA, gloo otherwise)
if want nccl; then
    CK="$(mktemp -d)"
    step "torchrun 1 rank" 90 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m embcache dlrm \
        train --device "$DEV" --max-steps "$DLRM_STEPS" --checkpoint-dir "$CK" --no-progress
    rm -rf "$CK"
fi
# optional: the default test suite, on several workers (pytest-xdist is on the GPU machines)
want suite && step "default test suite" 540 "$PY" -m pytest -q -x -n "$(( CORES < 8 ? CORES : 8 ))" \
    -p no:cacheprovider tests
echo "device_check: done in $((SECONDS - T0)) s" | tee -a "$LOG"
ls -l "$OUT" | tee -a "$LOG"
