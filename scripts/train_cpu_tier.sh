#!/usr/bin/env bash
# Train, evaluate and bundle one method of the zoo's CPU tier (issue 16) in ONE call.
#
#   bash scripts/train_cpu_tier.sh METHOD [extra cl-zoo pretrain options...]
#   METHOD: simclr mocov2 dcl dclw simo jcl cmc cacr  (recipes/METHOD_imagenette64_cpu_tier.yaml)
#           or a control run of issue 23: simclr_tau0.1 dcl_150views cmc_sharedcrop (scripts/bundle_cpu_tier.py's CONTROLS;
#           published into its method's card with scripts/add_tier_seed.py METHOD --control BUNDLE)
#
# An hour or more per method: start it detached so it survives the shell, e.g.
#   setsid bash scripts/train_cpu_tier.sh simo > tier-simo.out 2>&1 < /dev/null &
# Run it again after an interruption: pretraining continues from the run's last checkpoint
# (--resume), a finished run is only exported and evaluated again.
# Expected pretraining time, 30 epochs on a dedicated 2-core CPU: `--precision auto` trains in bf16 on
# AMX and AVX512_BF16 CPUs (measured 2.07x fp32 for full-width ResNet-18 at 64 px on a Zen 5 EPYC).
# Measured there in bf16 (median epoch; sum of 30 epochs): dcl 36 s (22 min), simclr 40 s (22.5 min),
# dclw 38 s (19 min), mocov2 48-62 s (26 min); one-directional SiMo 28 s (the tier's SiMo is now
# symmetric like MoCo v2, about twice that); cmc and jcl: see the README table; cacr ~3x dcl from
# benchmarks/cpu_tier_step_cost.py (~55 min). All eight: about 4 h. In fp32 roughly twice that.
# Keep the machine otherwise idle: on two cores a bf16 run slowed 7x while an evaluation shared them.
#
# Steps: `cl-zoo pretrain` on Imagenette train (64 px, the recipe's protocol) in its own process
# group (setsid) with its log in $DEST/logs/pretrain.log; then scripts/evaluate_and_bundle.sh with
# the named dataset `imagenette` found under $DATA_DIR (kNN k=20/200 T=0.1 and the fast linear probe
# on Imagenette val, float32 then the float16 copy, which must stay within 0.1 point).
# Writes:
#   $RUN_ROOT/METHOD/               the run (checkpoint.pt, metrics.csv, curves.png, model/)
#   $OUT/METHOD_resnet18.imagenette64_cpu/model/    the float16 bundle: weights, config, card
#   $OUT/METHOD_resnet18.imagenette64_cpu/{logs,reports,run}/   logs (machine.txt: the CPU, or the GPU and its host), JSON reports, recipe/curve copies
# Then `python scripts/bundle_cpu_tier.py METHOD --random-init DIR` publishes it under model_cards/.
# (CMC's bundle is named cmc_resnet18.imagenette64_cpu too: its backbone is cmc_resnet18_lab, the L/ab
# pair at ResNet-18's parameter count.)
# Environment:
#   DATA_DIR   folder with imagenette128-train.tar.gz and imagenette128-val.tar.gz
#              (default: ../shared/datasets next to the repository)
#   RUN_ROOT   run folders (default ./runs/cpu_tier); OUT bundles (default ./runs/cpu_tier_bundles)
#   EPOCHS     override the recipe's epochs (tests, or to fit a deadline)
#   PRECISION  passed as --precision when set; otherwise --precision auto when this cl-zoo offers it
#              (bf16 autocast where it was measured faster, else fp32), else the recipe's fp32
#   BUDGET_S   seconds allowed for pretraining (default: none); at the deadline the run's process
#              group is stopped and the last completed epoch is exported; rerun later to continue
#   POLL_S     seconds between progress lines (default 30); KNN_K, KNN_T, EVAL_WORKERS, PYTHON as
#              scripts/evaluate_and_bundle.sh
set -euo pipefail
# shellcheck source=scripts/supervise_pretrain.sh
. "$(dirname "$0")/supervise_pretrain.sh"

METHOD=${1:?usage: scripts/train_cpu_tier.sh METHOD [pretrain options]  (simclr mocov2 dcl dclw simo jcl cmc cacr)}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RECIPE=recipes/${METHOD}_imagenette64_cpu_tier.yaml
[ -f "$RECIPE" ] || { echo "error: no CPU-tier recipe for '$METHOD' ($RECIPE); methods: simclr mocov2 dcl dclw simo jcl cmc cacr; controls: simclr_tau0.1 dcl_150views cmc_sharedcrop" >&2; exit 2; }
DATA_DIR=$(cd "${DATA_DIR:-$ROOT/../shared/datasets}" 2>/dev/null && pwd) || { echo "error: DATA_DIR ${DATA_DIR:-$ROOT/../shared/datasets} not found" >&2; exit 2; }
TRAIN=$DATA_DIR/imagenette128-train.tar.gz
VAL=$DATA_DIR/imagenette128-val.tar.gz
for f in "$TRAIN" "$VAL"; do
    [ -f "$f" ] || { echo "error: $f not found (set DATA_DIR to the folder with the Imagenette archives)" >&2; exit 2; }
done
RUN_ROOT=${RUN_ROOT:-$ROOT/runs/cpu_tier}
RUN=$RUN_ROOT/$METHOD
OUT=${OUT:-$ROOT/runs/cpu_tier_bundles}
DEST=$OUT/${METHOD}_resnet18.imagenette64_cpu
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
CLZOO=("$PY" -m cl_zoo.cli)
mkdir -p "$DEST/logs" "$DEST/reports" "$DEST/run" "$RUN_ROOT"

EXTRA=()
[ -n "${EPOCHS:-}" ] && EXTRA+=(--epochs "$EPOCHS")
if [ -n "${PRECISION:-}" ]; then
    EXTRA+=(--precision "$PRECISION")
else
    HELP=$("${CLZOO[@]}" pretrain --help 2>/dev/null || true)
    case "$HELP" in *"auto|"*) EXTRA+=(--precision auto) ;; esac
fi
EXTRA+=("$@")
RESUME=()
[ -f "$RUN/checkpoint.pt" ] && RESUME=(--resume)

echo "== pretrain $METHOD ($RECIPE) -> $RUN ${RESUME[*]:-} ${EXTRA[*]:-}"
# The card's machine line (scripts/bundle_cpu_tier.py): the CPU as cl-zoo's precision policy sees it, and the
# GPU first where pretrain trains on one: --device cuda[:N], or the default auto with CUDA available
# (scripts/gpu_tier_runs.sh).
DEVICE_ARG=auto
prev=""
for a in "$@"; do
    case "$prev" in --device) DEVICE_ARG=$a ;; esac
    case "$a" in --device=*) DEVICE_ARG=${a#--device=} ;; esac
    prev=$a
done
"$PY" -c "
import sys, torch
from cl_zoo.errors import ClZooError
from cl_zoo.precision import cpu_capability
from cl_zoo.train.launch import resolve_device
cpu = cpu_capability().describe()
try:
    device = resolve_device(sys.argv[1])  # pretrain's own choice
except ClZooError:
    device = torch.device('cpu')  # pretrain refuses the option below, in its own words
print(f'{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, torch {torch.__version__}); host CPU {cpu}' if device.type == 'cuda' else cpu)
" "$DEVICE_ARG" > "$DEST/logs/machine.txt"
echo "machine: $(cat "$DEST/logs/machine.txt")"
START=$(date +%s)
# setsid: the run gets its own process group, so a deadline stops it (and only it) cleanly.
setsid "${CLZOO[@]}" pretrain --recipe "$RECIPE" --data "$TRAIN" --val "$VAL" --out "$RUN" --no-progress \
    ${RESUME[@]+"${RESUME[@]}"} ${EXTRA[@]+"${EXTRA[@]}"} >>"$DEST/logs/pretrain.log" 2>&1 &
PID=$!
supervise_pretrain "$PID" "$DEST/logs/pretrain.log" "$START" "${BUDGET_S:-}" "${POLL_S:-30}" "; rerun this script to continue"
if [ "$STATUS" = failed ]; then
    echo "error: pretraining failed (log: $DEST/logs/pretrain.log); rerun to resume from the last checkpoint" >&2
    exit 1
fi
if [ "$STATUS" = stopped ]; then
    [ -f "$RUN/checkpoint.pt" ] || { echo "error: no checkpoint to export" >&2; exit 1; }
    "$PY" -c "import sys; from cl_zoo.train.loop import export_run; print('exported', export_run(sys.argv[1]))" "$RUN"
fi
cp "$RUN"/recipe.yaml "$RUN"/metrics.csv "$DEST/run/" 2>/dev/null || true
cp "$RUN"/curves.png "$DEST/run/" 2>/dev/null || true

# Imagenette as a named dataset under DATA_DIR, so the card's metrics read imagenette_knn_k200_top1 etc.
EVAL_ARGS="--root $DATA_DIR --test-split val ${EVAL_ARGS:-}" PYTHON="$PY" \
    bash "$ROOT/scripts/evaluate_and_bundle.sh" "$RUN/model" "$DEST" imagenette imagenette
echo "bundle: $DEST/model"
