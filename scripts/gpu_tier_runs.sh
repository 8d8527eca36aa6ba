#!/usr/bin/env bash
# Several CPU-tier runs (issue 23) at once on one lent GPU machine, whose device time is short:
#
#   DATA_DIR=/tmp/tier-data bash scripts/gpu_tier_runs.sh "dcl_150views:1 dcl:2 ..."   (NAME:SEED, longest first)
#
# Each run is exactly what the CPU queue runs (scripts/train_cpu_tier.sh NAME --seed SEED: the committed
# recipe, --precision auto, which is bf16 autocast on CUDA as on an AVX512_BF16 CPU, the same in-memory
# augmentations on the training device), so its seed joins the CPU seeds of the same row. Only the device
# differs, and the card says so: train_cpu_tier.sh's machine line names the GPU. The evaluation stays
# what every other seed got, fp32 torch on the CPU (EVAL_ARGS=--device cpu): a GPU's fp32 convolutions
# may round through TF32 and would move near-tied kNN votes.
# The tier's 64 px ResNet-18 step is too small to fill the GPU, so SLOTS runs share it. A run is started
# only while LATEST_START_S has not passed, and whatever has finished by DEADLINE_S is packed into
# $OUT/bundles.tar.gz (the bundles without weights: the seeds' reports, logs, metrics.csv and configs are
# all that scripts/add_tier_seed.py reads; the weights of a non-published seed are not kept anyway) and
# $OUT/session.log. Unpack the archive into $TIER_WORK and publish with add_tier_seed.py as usual.
#
# Through the device tool (the 2026-11-26 session): the checkout must travel under 64 MiB, so for the
# calls only, untrack the weights, tests and cards (`git rm -r -q --cached model_cards tests` plus
# `/model_cards/` and `/tests/` lines in .git/info/exclude; `git reset -q` and drop the lines after).
# The two Imagenette archives and the faiss wheel (cl-zoo knn's search) do not fit one call either, and
# a call's checkout replaces the last one's (an ignored folder it does not carry is gone), but /tmp stays
# while the machine is warm (30 s after a call). So a first call carries .gpu1/ (the val archive, and the
# faiss-cpu, webdataset and braceexpand wheels) and moves it out of the checkout:
#   mkdir -p /tmp/tier-data && cp .gpu1/*.tar.gz /tmp/tier-data/ &&
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu1/*.whl
# and a second, at once, carries .gpu2/ (the train archive) and runs
#   export PYTHONPATH=/tmp/site:$PWD && cp .gpu2/*.tar.gz /tmp/tier-data/ &&
#   DATA_DIR=/tmp/tier-data bash scripts/gpu_tier_runs.sh "..."
# Measured there (H200, 16 host cores, 5 runs at once): CACR, DCL at 75 epochs and JCL trained in 3.3-3.6
# min each, the two-view methods (4 at once) in 1.1-1.2 min, and each run's CPU evaluation took most of
# the rest; the five long runs were done in 372 s, the four short ones in 250 s.
# Environment: OUT (default ./gpu-out), PYTHON (default python3), SLOTS (default 4), LATEST_START_S
#   (default 240), DEADLINE_S (default 500), EVAL_WORKERS (default 4 per run), OMP_NUM_THREADS (default: cores / SLOTS),
#   EPOCHS (a rehearsal: shorten every run).
set -uo pipefail
RUNS_LIST=${1:?usage: scripts/gpu_tier_runs.sh "NAME:SEED NAME:SEED ..."}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-out}
PY=${PYTHON:-python3}
SLOTS=${SLOTS:-4}
LATEST_START_S=${LATEST_START_S:-240}
DEADLINE_S=${DEADLINE_S:-500}
WORK=${TIER_WORK:-/tmp/tier-gpu}
: "${DATA_DIR:?set DATA_DIR to the folder with imagenette128-train.tar.gz and imagenette128-val.tar.gz}"
START=$(date +%s)
mkdir -p "$OUT" "$WORK/logs"
elapsed() { echo $(( $(date +%s) - START )); }
pack() {
    # bundles without weights, plus the runs' metrics.csv (epoch times even for a run cut off by the deadline)
    tar czf "$OUT/bundles.tar.gz" -C "$WORK" --exclude='*.safetensors' --exclude='checkpoint*.pt' \
        $(cd "$WORK" && ls -d bundles_seed* logs runs_seed*/*/metrics.csv 2>/dev/null) 2>/dev/null
}
trap pack EXIT
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 CL_ZOO_CACHE=${CL_ZOO_CACHE:-/tmp/cl-zoo-cache}
# SLOTS processes share the host's cores (decoding, the CPU evaluation): torch's default of one thread per
# core in each of them would oversubscribe it several times over.
NPROC=$(nproc 2>/dev/null || echo 2)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( NPROC / SLOTS > 1 ? NPROC / SLOTS : 1 ))}

echo "== environment ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$PY" -c "import torch, faiss, cl_zoo; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'faiss', faiss.__version__, 'cl_zoo', cl_zoo.__version__)" || exit 2
for f in imagenette128-train.tar.gz imagenette128-val.tar.gz; do
    [ -f "$DATA_DIR/$f" ] || { echo "error: $DATA_DIR/$f not found"; exit 2; }
done

declare -A PIDS=()
for item in $RUNS_LIST; do
    name=${item%%:*} seed=${item##*:}
    while [ "$(jobs -rp | wc -l)" -ge "$SLOTS" ]; do sleep 2; done
    if [ "$(elapsed)" -gt "$LATEST_START_S" ]; then echo "=== $(elapsed)s skipped $item: past LATEST_START_S"; continue; fi
    echo "=== $(elapsed)s start $item"
    (
        RUN_ROOT=$WORK/runs_seed$seed OUT=$WORK/bundles_seed$seed POLL_S=60 PYTHON="$PY" \
            EVAL_WORKERS=${EVAL_WORKERS:-4} EVAL_ARGS="--device cpu" \
            bash scripts/train_cpu_tier.sh "$name" --seed "$seed" > "$WORK/logs/${name}_seed$seed.log" 2>&1
        rc=$?
        echo "=== $(elapsed)s done $item (exit $rc)"
        grep -E "knn_k200_top1|linear.*top1|float16 check" "$WORK/logs/${name}_seed$seed.log" | tail -n 4
    ) &
    PIDS[$item]=$!
done
while [ "$(jobs -rp | wc -l)" -gt 0 ] && [ "$(elapsed)" -lt "$DEADLINE_S" ]; do sleep 2; done
for item in "${!PIDS[@]}"; do
    kill -0 "${PIDS[$item]}" 2>/dev/null && echo "=== $(elapsed)s unfinished at the deadline: $item ($(tail -n 1 "$WORK/logs/${item%%:*}_seed${item##*:}.log"))"
done
echo "=== $(elapsed)s packing"
