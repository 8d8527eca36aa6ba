#!/usr/bin/env bash
# Issue 23's runs one after another in the background: tier seeds, control runs and transfer runs.
#
#   setsid nohup bash scripts/tier_queue.sh QUEUE_FILE > queue.log 2>&1 < /dev/null &
#
# Run it from a worktree nobody edits (git worktree add --detach ../queue-tree HEAD; cd ../queue-tree;
# PYTHONPATH=$PWD ... bash scripts/tier_queue.sh ...): a pretraining imports parts of cl_zoo lazily
# (the kNN monitor at epoch 5), so an edit to the checkout it runs from can meet the older modules it
# already holds and kill it with an ImportError; bash also reads this script as it runs. PYTHONPATH
# makes scripts/*.py import the worktree's cl_zoo rather than an editable install's.
#
# QUEUE_FILE has one run per line (blank lines and # comments are skipped); it is read again before
# every run, so lines can be added, removed or reordered while the queue works:
#   pretrain NAME SEED                   scripts/train_cpu_tier.sh NAME --seed SEED  (NAME: a method or a control)
#   transfer TASK METHOD SEED [random]   scripts/tier_transfer.py TASK METHOD --seed SEED [--random-init]
#   transfer detection METHOD SEED detectron2 [random]   ... --engine detectron2 (the same fine-tune there)
# A line is done when its output exists, so the queue can be killed and started again at any time
# (a stopped pretraining continues from its checkpoint, a stopped detection from its last.pt):
#   pretrain: the seed is in its card already (the published seed 0, eval_knn_seedSEED.json, or a
#             control's eval_knn_NAME_seedSEED.json), or its evaluated bundle exists,
#             $TIER_WORK/bundles_seedSEED/NAME_resnet18.imagenette64_cpu/reports/linear_fp16.json
#             (publish it: python scripts/add_tier_seed.py METHOD [BUNDLE] [--control BUNDLE])
#   transfer: the report in the card folder, model_cards/METHOD_resnet18.imagenette64_cpu/transfer_*.json
# A line that fails is skipped until its flag $TIER_WORK/failed.<line> is removed.
# Two cores do one run at a time well; anything else on the machine slows the run (bf16 epochs on two
# cores slowed 7x beside an evaluation), so keep other work light while it runs.
# Environment: TIER_WORK (default runs/tier_queue) holds runs, bundles, logs and flags; DATA_DIR as
# scripts/train_cpu_tier.sh.
set -uo pipefail
QUEUE=${1:?usage: scripts/tier_queue.sh QUEUE_FILE}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUEUE=$(cd "$(dirname "$QUEUE")" && pwd)/$(basename "$QUEUE")
WORK=${TIER_WORK:-$ROOT/runs/tier_queue}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
cd "$ROOT"
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi

# The output that marks a line done (empty: the line is malformed).
output_of() {
    local kind=$1 a=${2:-} b=${3:-} c=${4:-} d=${5:-} e=${6:-}
    case "$kind" in
        pretrain)
            [ -n "$b" ] && [ -f "recipes/${a}_imagenette64_cpu_tier.yaml" ] || return 0
            local method card
            method=$(sed -n 's/^method: *\([a-z0-9]*\).*/\1/p' "recipes/${a}_imagenette64_cpu_tier.yaml")
            card=$ROOT/model_cards/${method}_resnet18.imagenette64_cpu
            if [ "$a" = "$method" ] && [ "$b" = 0 ] && [ -f "$card/config.json" ]; then echo "$card/config.json"
            elif [ "$a" = "$method" ] && [ -f "$card/eval_knn_seed$b.json" ]; then echo "$card/eval_knn_seed$b.json"
            elif [ -f "$card/eval_knn_${a}_seed$b.json" ]; then echo "$card/eval_knn_${a}_seed$b.json"
            else echo "$WORK/bundles_seed$b/${a}_resnet18.imagenette64_cpu/reports/linear_fp16.json"
            fi ;;
        transfer)
            local suffix=""
            [ "$d" = random ] && suffix=_random_init
            [ "$d" = detectron2 ] && suffix=_detectron2
            [ "$d" = detectron2 ] && [ "$e" = random ] && suffix=_detectron2_random_init
            case "$a" in
                detection) [ -n "$c" ] && echo "$ROOT/model_cards/${b}_resnet18.imagenette64_cpu/transfer_bccd_detection${suffix}_seed$c.json" ;;
                cifar10) echo "$ROOT/model_cards/${b}_resnet18.imagenette64_cpu/transfer_cifar10_linear${suffix}.json" ;;
            esac ;;
    esac
}

while true; do
    line=""
    while read -r raw; do
        raw=${raw%%#*}
        read -r -a words <<< "$raw"
        [ ${#words[@]} -eq 0 ] && continue
        flag="$WORK/failed.$(echo "${words[*]}" | tr ' /' '__')"
        [ -f "$flag" ] && continue
        out=$(output_of "${words[@]}")
        if [ -z "$out" ]; then
            echo "=== skipping malformed line: ${words[*]}" >&2; touch "$flag"; continue
        fi
        [ -f "$out" ] && continue
        line="${words[*]}"; break
    done < "$QUEUE"
    [ -z "$line" ] && { echo "=== $(date -u +%H:%M:%S) queue done"; exit 0; }
    read -r -a words <<< "$line"
    echo "=== $(date -u +%H:%M:%S) start: $line"
    case "${words[0]}" in
        pretrain)
            RUN_ROOT=$WORK/runs_seed${words[2]} OUT=$WORK/bundles_seed${words[2]} POLL_S=${POLL_S:-300} \
                bash scripts/train_cpu_tier.sh "${words[1]}" --seed "${words[2]}" ;;
        transfer)
            extra=()
            [ "${words[4]:-}" = random ] && extra=(--random-init)
            [ "${words[4]:-}" = detectron2 ] && extra=(--engine detectron2)
            [ "${words[4]:-}" = detectron2 ] && [ "${words[5]:-}" = random ] && extra=(--engine detectron2 --random-init)
            RUN_ROOT=$WORK/transfer "$PY" scripts/tier_transfer.py "${words[1]}" "${words[2]}" --seed "${words[3]:-0}" ${extra[@]+"${extra[@]}"} ;;
    esac
    code=$?
    if [ $code -ne 0 ] || [ ! -f "$(output_of "${words[@]}")" ]; then
        touch "$WORK/failed.$(echo "$line" | tr ' /' '__')"
        echo "=== $(date -u +%H:%M:%S) FAILED ($code): $line"
    else
        echo "=== $(date -u +%H:%M:%S) done: $line"
    fi
done
