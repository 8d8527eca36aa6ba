#!/usr/bin/env bash
# Evaluate a trained model folder and bundle a float16 copy of it, with the issue-8 check that the
# float16 weights score within 0.1 point of the float32 ones.
#
#   bash scripts/evaluate_and_bundle.sh MODEL_DIR DEST TRAIN_DATA TEST_DATA
#
# MODEL_DIR is a checkpoint folder (e.g. RUN/model from `cl-zoo pretrain`); TRAIN_DATA/TEST_DATA are
# what `cl-zoo knn --train/--test` take (ImageFolder folders, archives, named datasets). Writes
#   DEST/model/     the float16 copy: config, safetensors, card with the metrics measured on itself
#   DEST/reports/   knn.json, linear.json (float32) and knn_fp16.json, linear_fp16.json
#   DEST/logs/      one log per evaluation
# and updates MODEL_DIR's config and card with the float32 reports. Exits 1 (files kept) when a
# top-1 metric of the float16 copy moves by more than 0.1 point.
# Environment: KNN_K (default 20,200), KNN_T (default 0.1), PYTHON, EVAL_WORKERS (default: CPUs, at most 8),
#   EVAL_ARGS (extra options for every knn/linear-eval call, e.g. "--data-root .data --test-split val"
#   when TRAIN/TEST are named datasets), EVAL_PRECISION (default fp32), EVAL_BACKEND (default torch).
# Why fp32 torch by default: the check is about the precision the weights are STORED in. With bf16
# compute (auto on AMX/AVX512_BF16 CPUs) every activation is rounded to 8 mantissa bits, which moves
# near-tied kNN votes by more than fp16 weight rounding does, so the gate would measure compute noise
# (the MoCo v2 tier run: +0.13/+0.15/-0.10 pt with bf16 features on both sides). fp32 numbers are also
# the ones another machine reproduces; a card states bf16 numbers only when asked for them.
set -euo pipefail

SRC=${1:?usage: scripts/evaluate_and_bundle.sh MODEL_DIR DEST TRAIN_DATA TEST_DATA}
DEST=${2:?usage: scripts/evaluate_and_bundle.sh MODEL_DIR DEST TRAIN_DATA TEST_DATA}
TRAIN=${3:?usage: scripts/evaluate_and_bundle.sh MODEL_DIR DEST TRAIN_DATA TEST_DATA}
TEST=${4:?usage: scripts/evaluate_and_bundle.sh MODEL_DIR DEST TRAIN_DATA TEST_DATA}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then PY=$ROOT/.venv/bin/python; fi
CLZOO=("$PY" -m cl_zoo.cli)
[ -f "$SRC/config.json" ] || { echo "error: $SRC is not a checkpoint folder (no config.json)" >&2; exit 2; }
mkdir -p "$DEST/logs" "$DEST/reports"
NPROC=$(nproc 2>/dev/null || echo 2)
W=${EVAL_WORKERS:-$(( NPROC < 8 ? NPROC : 8 ))}
read -r -a EXTRA <<< "--precision ${EVAL_PRECISION:-fp32} --backend ${EVAL_BACKEND:-torch} ${EVAL_ARGS:-}"

echo "== kNN (k=${KNN_K:-20,200}, T=${KNN_T:-0.1})"
"${CLZOO[@]}" knn --model "$SRC" --train "$TRAIN" --test "$TEST" --k "${KNN_K:-20,200}" --temperature "${KNN_T:-0.1}" --workers "$W" ${EXTRA[@]+"${EXTRA[@]}"} \
    --out "$DEST/reports/knn.json" 2>&1 | tee "$DEST/logs/knn.log"
echo "== linear probe (fast protocol)"
"${CLZOO[@]}" linear-eval --model "$SRC" --train "$TRAIN" --test "$TEST" --protocol fast --workers "$W" ${EXTRA[@]+"${EXTRA[@]}"} \
    --out "$DEST/reports/linear.json" 2>&1 | tee "$DEST/logs/linear.log"
"${CLZOO[@]}" card-update "$SRC" "$DEST/reports/knn.json"
"${CLZOO[@]}" card-update "$SRC" "$DEST/reports/linear.json"

echo "== float16 copy -> $DEST/model"
"$PY" - "$SRC" "$DEST/model" <<'PYEOF'
import dataclasses, json, sys
from pathlib import Path
import torch
from cl_zoo.checkpoint.card import extra_sections
from cl_zoo.checkpoint import save_pretrained
from cl_zoo.fileio import atomic_write_bytes
from cl_zoo.factory import load_pretrained

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
# What the run recorded about itself (the data's fingerprint, the precision it trained in) stays with the copy.
extra = {k: config[k] for k in ("training_data", "training_precision") if k in config}
save_pretrained(model, dst, recipe=config.get("recipe"), metrics=metrics, dtype=torch.float16, card_sections=sections,
                extra_config=extra)
if (src / "curves.png").is_file():
    atomic_write_bytes(dst / "curves.png", (src / "curves.png").read_bytes())
PYEOF

# Issue 8: bundled float16 weights must score within 0.1 point of the float32 ones.
echo "== float16 check: same kNN and linear probe on $DEST/model"
"${CLZOO[@]}" knn --model "$DEST/model" --train "$TRAIN" --test "$TEST" --k "${KNN_K:-20,200}" --temperature "${KNN_T:-0.1}" --workers "$W" ${EXTRA[@]+"${EXTRA[@]}"} \
    --out "$DEST/reports/knn_fp16.json" 2>&1 | tee "$DEST/logs/knn_fp16.log"
"${CLZOO[@]}" linear-eval --model "$DEST/model" --train "$TRAIN" --test "$TEST" --protocol fast --workers "$W" ${EXTRA[@]+"${EXTRA[@]}"} \
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
