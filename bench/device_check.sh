#!/usr/bin/env bash
# The GPU checks in one call, for a session that is lent a GPU machine for a few minutes
# (docs/benchmarks.md, "On a GPU machine"): the CUDA tests, `bench gpu`, the host ceiling on
# that machine's cores, HEAT on its cores against the torch engine on its GPU, and a 1-rank
# torchrun DLRM on NCCL. Each step has a time limit of its own and a failed step does not
# stop the others; everything it measures lands in $OUT (the device tool's folder; here by
# default bench/results/device), with one log, device_check.log.
#
# Nothing is installed: the repository runs from its folder (PYTHONPATH), on the machine's
# own torch, numba, pyarrow and pytest; torchrec is not needed (the plain-torch DLRM).
# MovieLens-100k must be fetched here first and carried (the device machine reaches no
# network): `.venv/bin/python -c 'from embcache.data.movielens import ml100k_dir; ml100k_dir()'`,
# then the device tool's run with carry ["datasets/ml-100k"].
#
#   bash bench/device_check.sh                # steps cuda gpu host cf nccl, in that order
#   bash bench/device_check.sh cuda gpu       # some of them: one device call of at most 600 s
#   bash bench/device_check.sh host cf nccl   #   each, so the five go in two calls
#   bash bench/device_check.sh suite          # the default test suite (pytest -n 8)
#   SMALL=1 bash bench/device_check.sh        # the same steps at toy sizes, on the CPU too
#
# Each step's limit is its worst case; on the CPU at toy sizes the five take 2 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STEPS=" ${*:-cuda gpu host cf nccl} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
for s in $STEPS; do
    case "$s" in cuda|gpu|host|cf|nccl|suite) ;; *) echo "device_check: unknown step '$s' (cuda gpu host cf nccl suite)"; exit 2;; esac
done
OUT="${OUT:-bench/results/device}"
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
PY="${PYTHON:-python3}"
CORES="$(nproc)"
SMALL="${SMALL:-}"
HAVE_CUDA="$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)"
DEV=$([ "$HAVE_CUDA" = 1 ] && echo cuda || echo cpu)

step() {  # step NAME SECONDS COMMAND...: run with a limit, log its output and status
    local name="$1" limit="$2"; shift 2
    echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
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
    GPU_ARGS=(--scale 0.002 --dims 16 --ratios 0.015 --steps 4 --warmup-steps 2 --no-profile)
    HOST_ARGS=(--scale 0.01 --ratios 0.015 --steps 2 --warmup-steps 1 --shapes one-hot --threads 1 "$CORES")
    CF_ARGS=(--datasets ml-100k --ml-epochs 1 --ml-negatives 64 --cost-epochs 1)
    DLRM_STEPS=5
else
    GPU_ARGS=()
    HOST_ARGS=(--ratios 0.015 --threads 1 "$CORES")
    CF_ARGS=(--datasets ml-100k --ml-epochs 5 --ml-negatives 64 1000 --cost-epochs 2)
    DLRM_STEPS=60
fi

# the default test suite, on several workers (pytest-xdist is on the GPU machines)
want suite && step "default test suite" 540 "$PY" -m pytest -q -x -n "$(( CORES < 8 ? CORES : 8 ))" \
    -p no:cacheprovider tests
# 1. the tests marked cuda (skipped without a GPU: then they say so)
want cuda && step "pytest -m cuda" 150 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests
# 2. DLRM on one GPU: the cache at 0.5 / 1.5 / 5 % against the whole table on the device
want gpu && step "bench gpu" 400 "$PY" -m embcache bench gpu --device "$DEV" --out "$OUT" --name gpu "${GPU_ARGS[@]}"
# 3. the cache's host ceiling on this machine's cores (measured, not projected)
want host && step "bench host" 150 "$PY" -m embcache bench host --out "$OUT" --name host_device "${HOST_ARGS[@]}"
# 4. HEAT on every core against the torch engine on the GPU, same data and settings
want cf && step "bench cf" 240 "$PY" -m embcache bench cf --threads "$CORES" --torch-device "$DEV" --no-baseline \
    --no-old-rule --no-plot --out-dir "$OUT" --name cf_device "${CF_ARGS[@]}"
# 5. DLRM under torchrun, one rank (NCCL where the device is CUDA, gloo otherwise)
if want nccl; then
    CK="$(mktemp -d)"
    step "torchrun 1 rank" 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m embcache dlrm \
        train --device "$DEV" --max-steps "$DLRM_STEPS" --checkpoint-dir "$CK" --no-progress
    rm -rf "$CK"
fi
ls -l "$OUT" | tee -a "$LOG"
