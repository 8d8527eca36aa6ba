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
#   EPOCHS       override the recipe's epochs (to fit the machine's time limit)
#   BUDGET_S     seconds allowed for pretraining (default 420); at the deadline the run is stopped
#                and the last completed epoch's checkpoint is exported instead
#   RUN_ROOT     where the run folder lives (default /tmp/cl-zoo-reference)
#   KNN_K        neighbour counts for the kNN evaluation (default 20,200)
#   ARCHIVE      the ImageFolder archive (default .data/cifar10-jpeg.tar.gz)
#   OUT          output root (default ./reference-out); PYTHON the interpreter (default .venv's)
#   POLL_S       seconds between progress lines while pretraining (default 10)
set -euo pipefail

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
[ -n "${EPOCHS:-}" ] && EXTRA+=(--epochs "$EPOCHS")
RESUME=()
[ -f "$RUN/checkpoint.pt" ] && RESUME=(--resume)

echo "== pretrain $METHOD ($RECIPE) -> $RUN, budget ${BUDGET_S}s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
START=$(date +%s)
# setsid: the run gets its own process group, so a deadline stops it (and only it) cleanly.
setsid "${CLZOO[@]}" pretrain --recipe "$RECIPE" --data "$ARCHIVE" --val "$ARCHIVE" --out "$RUN" \
    --no-progress "${RESUME[@]}" "${EXTRA[@]}" >"$DEST/logs/pretrain.log" 2>&1 &
PID=$!
STATUS=running
while kill -0 "$PID" 2>/dev/null; do
    sleep "${POLL_S:-10}"
    NOW=$(date +%s)
    echo "[$((NOW - START))s] $(grep -E '^epoch ' "$DEST/logs/pretrain.log" | tail -n 1 || true)"
    if [ $((NOW - START)) -ge "$BUDGET_S" ]; then
        echo "budget reached: stopping the run (process group $PID)"
        kill -TERM -- "-$PID" 2>/dev/null || true
        sleep 5
        kill -KILL -- "-$PID" 2>/dev/null || true
        STATUS=stopped
        break
    fi
done
if [ "$STATUS" = running ]; then
    if wait "$PID"; then STATUS=done; else STATUS=failed; fi
fi
tail -n 5 "$DEST/logs/pretrain.log"
echo "pretraining $STATUS after $(( $(date +%s) - START ))s"
if [ "$STATUS" != done ]; then
    [ -f "$RUN/checkpoint.pt" ] || { echo "error: no checkpoint to export" >&2; exit 1; }
    "$PY" -c "import sys; from cl_zoo.train.loop import export_run; print('exported', export_run(sys.argv[1]))" "$RUN"
fi
cp "$RUN"/recipe.yaml "$RUN"/metrics.csv "$DEST/run/" 2>/dev/null || true
cp "$RUN"/curves.png "$DEST/run/" 2>/dev/null || true

echo "== kNN (k=${KNN_K:-20,200}, T=0.1)"
"${CLZOO[@]}" knn --model "$RUN/model" --train "$ARCHIVE" --test "$ARCHIVE" --k "${KNN_K:-20,200}" --temperature 0.1 \
    --out "$DEST/reports/knn.json" 2>&1 | tee "$DEST/logs/knn.log"
echo "== linear probe (fast protocol)"
"${CLZOO[@]}" linear-eval --model "$RUN/model" --train "$ARCHIVE" --test "$ARCHIVE" --protocol fast \
    --out "$DEST/reports/linear.json" 2>&1 | tee "$DEST/logs/linear.log"
"${CLZOO[@]}" card-update "$RUN/model" "$DEST/reports/knn.json"
"${CLZOO[@]}" card-update "$RUN/model" "$DEST/reports/linear.json"

echo "== float16 copy -> $DEST/model"
"$PY" - "$RUN/model" "$DEST/model" <<'PYEOF'
import dataclasses, json, sys
from pathlib import Path
import torch
from cl_zoo.card import extra_sections
from cl_zoo.checkpoint import save_pretrained
from cl_zoo.fileio import atomic_write_bytes
from cl_zoo.hub import load_pretrained

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
config = json.loads((src / "config.json").read_text())
# The evaluation metrics are measured again on the float16 weights and applied with card-update
# below, so the copy's card states only numbers its own weights produced (plus the training monitor).
evaluated = {k for e in config.get("evaluations") or [] for k in (e.get("metrics") or {})}
model = load_pretrained(str(src))
cfg_metrics = {k: v for k, v in (model.pretrained_cfg.metrics or {}).items() if k not in evaluated}
model.pretrained_cfg = dataclasses.replace(model.pretrained_cfg, metrics=cfg_metrics)
metrics = {k: v for k, v in (config.get("metrics") or {}).items() if k not in evaluated}
card = src / "README.md"
sections = extra_sections(card.read_text(encoding="utf-8")) if card.is_file() else {}  # training log + curve
save_pretrained(model, dst, recipe=config.get("recipe"), metrics=metrics, dtype=torch.float16, card_sections=sections)
if (src / "curves.png").is_file():
    atomic_write_bytes(dst / "curves.png", (src / "curves.png").read_bytes())
PYEOF

# Issue 8: bundled float16 weights must score within 0.1 point of the float32 ones.
echo "== float16 check: same kNN and linear probe on $DEST/model"
"${CLZOO[@]}" knn --model "$DEST/model" --train "$ARCHIVE" --test "$ARCHIVE" --k "${KNN_K:-20,200}" --temperature 0.1 \
    --out "$DEST/reports/knn_fp16.json" 2>&1 | tee "$DEST/logs/knn_fp16.log"
"${CLZOO[@]}" linear-eval --model "$DEST/model" --train "$ARCHIVE" --test "$ARCHIVE" --protocol fast \
    --out "$DEST/reports/linear_fp16.json" 2>&1 | tee "$DEST/logs/linear_fp16.log"
"${CLZOO[@]}" card-update "$DEST/model" "$DEST/reports/knn_fp16.json"
"${CLZOO[@]}" card-update "$DEST/model" "$DEST/reports/linear_fp16.json"
FP16_OK=1
"$PY" - "$DEST/reports" <<'PYEOF' || FP16_OK=0
import sys
from pathlib import Path
from cl_zoo.eval.report import compare_reports

reports, ok = Path(sys.argv[1]), True
for task in ("knn", "linear"):
    for row in compare_reports(reports / f"{task}.json", reports / f"{task}_fp16.json", 0.001):
        ok &= row["ok"]
        print(f"{row['metric']:<24} fp32 {100 * row['a']:6.2f}%  fp16 {100 * row['b']:6.2f}%  "
              f"diff {100 * row['diff']:+.2f} pt  {'ok' if row['ok'] else 'MOVED MORE THAN 0.1 pt'}")
sys.exit(0 if ok else 1)
PYEOF
ls -la "$DEST/model"
if [ "$FP16_OK" != 1 ]; then
    echo "error: float16 weights moved a top-1 metric by more than 0.1 point (files kept in $DEST)" >&2
    exit 1
fi
echo "float16 check passed"
