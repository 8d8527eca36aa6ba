#!/usr/bin/env bash
# Train and evaluate one method's CIFAR-10 reference model in ONE call on a GPU machine.
#
#   bash scripts/train_reference.sh METHOD [extra cl-zoo pretrain options...]
#
# Expects the CIFAR-10 JPEG archive at .data/cifar10-jpeg.tar.gz (train/ and test/ inside) and
# writes everything worth keeping under $OUT (default ./reference-out):
#   $OUT/<method>/model/        the backbone, float16 safetensors + config + card (kNN/linear metrics)
#   $OUT/<method>/run/          recipe.yaml, metrics.csv, curves.png
#   $OUT/<method>/logs/         pretrain.log, knn.log, linear.log, knn_fp16.log, linear_fp16.log
#   $OUT/<method>/reports/      knn.json, linear.json (float32) and knn_fp16.json, linear_fp16.json (the
#                               float16 copy; the script fails if a top-1 moves by more than 0.1 point)
# Environment:
#   EPOCHS       override the recipe's epochs (to fit the machine's time limit; its warm-up shrinks in proportion)
#   BUDGET_S     seconds allowed for pretraining (default 420); at the deadline the run is stopped
#                and the last completed epoch's checkpoint is exported instead
#   RUN_ROOT     where the run folder lives (default /tmp/cl-zoo-reference)
#   KNN_K        neighbour counts for the kNN evaluation (default 20,200)
#   ARCHIVE      the ImageFolder archive (default .data/cifar10-jpeg.tar.gz)
#   OUT          output root (default ./reference-out); PYTHON the interpreter (default .venv's)
#   POLL_S       seconds between progress lines while pretraining (default 10)
set -euo pipefail
# shellcheck source=scripts/supervise_pretrain.sh
. "$(dirname "$0")/supervise_pretrain.sh"

METHOD=${1:?usage: scripts/train_reference.sh METHOD [pretrain options]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ARCHIVE=${ARCHIVE:-.data/cifar10-jpeg.tar.gz}
RECIPE=recipes/${METHOD}_cifar10.yaml
OUT=${OUT:-$ROOT/reference-out}
DEST=$OUT/$METHOD
RUN=${RUN_ROOT:-/tmp/cl-zoo-reference}/$METHOD
BUDGET_S=${BUDGET_S:-420}
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
CLZOO=("$PY" -m cl_zoo.cli)

[ -f "$ARCHIVE" ] || { echo "error: $ARCHIVE not found (CIFAR-10 as JPEG ImageFolder archive with train/ and test/)" >&2; exit 2; }
[ -f "$RECIPE" ] || { echo "error: no recipe $RECIPE" >&2; exit 2; }
mkdir -p "$DEST/logs" "$DEST/reports" "$DEST/run"
export CL_ZOO_CACHE=${CL_ZOO_CACHE:-/tmp/cl-zoo-cache}

EXTRA=("$@")
# the caller's own options come last, so their --set schedule.warmup_epochs=... wins over the scaled one
[ -n "${EPOCHS:-}" ] && EXTRA=(--epochs "$EPOCHS" --set "schedule.warmup_epochs=$(scaled_warmup "$PY" "$RECIPE" "$EPOCHS")" ${EXTRA[@]+"${EXTRA[@]}"})
RESUME=()
[ -f "$RUN/checkpoint.pt" ] && RESUME=(--resume)

echo "== pretrain $METHOD ($RECIPE) -> $RUN, budget ${BUDGET_S}s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
START=$(date +%s)
# setsid: the run gets its own process group, so a deadline stops it (and only it) cleanly.
setsid "${CLZOO[@]}" pretrain --recipe "$RECIPE" --data "$ARCHIVE" --val "$ARCHIVE" --out "$RUN" \
    --no-progress "${RESUME[@]}" "${EXTRA[@]}" >"$DEST/logs/pretrain.log" 2>&1 &
PID=$!
supervise_pretrain "$PID" "$DEST/logs/pretrain.log" "$START" "$BUDGET_S" "${POLL_S:-10}" ""
if [ "$STATUS" != done ]; then
    [ -f "$RUN/checkpoint.pt" ] || { echo "error: no checkpoint to export" >&2; exit 1; }
    "$PY" -c "import sys; from cl_zoo.train.loop import export_run; print('exported', export_run(sys.argv[1]))" "$RUN"
fi
cp "$RUN"/recipe.yaml "$RUN"/metrics.csv "$DEST/run/" 2>/dev/null || true
cp "$RUN"/curves.png "$DEST/run/" 2>/dev/null || true

# Evaluation, float16 copy and its 0.1-point check: shared with the bundled default model.
PYTHON="$PY" bash "$ROOT/scripts/evaluate_and_bundle.sh" "$RUN/model" "$DEST" "$ARCHIVE" "$ARCHIVE"
