#!/usr/bin/env bash
# Train and evaluate one method's CIFAR-10 reference model in ONE call on a GPU machine.
#
#   bash scripts/train_reference.sh METHOD [extra cl-zoo pretrain options...]
#
# Or across calls, for machine windows shorter than a run (the run is detached: setsid, its own
# session, so it outlives the call that started it):
#   bash scripts/train_reference.sh start METHOD [pretrain options...]   start it, return at once
#   bash scripts/train_reference.sh status METHOD      print running/done/failed/stopped and the last
#                                                      epoch line; exit 0 when finished, 3 while running,
#                                                      1 when never started or dead without a status
#   bash scripts/train_reference.sh collect METHOD     wait for it (at most WAIT_S seconds if set: still
#                                                      running then exits 3, collect again later), then
#                                                      export, evaluate (kNN KNN_K, linear) and write the
#                                                      card exactly as a foreground run does; STOP=1 stops
#                                                      it first and exports the last completed epoch
# A detached run has no deadline unless BUDGET_S is given to `start`. Its control files are in
# $OUT/<method>/detached/ (pid, status, started, run, archive); its log is $OUT/<method>/logs/pretrain.log.
# `start` with the run folder holding a checkpoint resumes it, as a foreground run does.
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

USAGE="usage: scripts/train_reference.sh [start|status|collect] METHOD [pretrain options]"
MODE=foreground
case "${1:-}" in
    start|status|collect|_supervise) MODE=$1; shift ;;
esac
METHOD=${1:?$USAGE}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ARCHIVE=${ARCHIVE:-.data/cifar10-jpeg.tar.gz}
RECIPE=recipes/${METHOD}_cifar10.yaml
OUT=${OUT:-$ROOT/reference-out}
DEST=$OUT/$METHOD
RUN=${RUN_ROOT:-/tmp/cl-zoo-reference}/$METHOD
BUDGET_S_GIVEN=${BUDGET_S:-}
BUDGET_S=${BUDGET_S:-420}
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
CLZOO=("$PY" -m cl_zoo.cli)

CTL=$DEST/detached
export CL_ZOO_CACHE=${CL_ZOO_CACHE:-/tmp/cl-zoo-cache}

# is_running: the detached supervisor (a session leader whose pid is in $CTL/pid) is still alive.
is_running() {
    [ -f "$CTL/pid" ] && kill -0 "$(cat "$CTL/pid")" 2>/dev/null
}

# report_status: one line for `status` and `collect`; sets STATE (running, done, failed, stopped, none, dead).
report_status() {
    if [ -f "$CTL/status" ]; then
        STATE=$(cat "$CTL/status")
    elif is_running; then
        STATE=running
    elif [ -f "$CTL/pid" ]; then
        STATE=dead  # the supervisor went away without writing a status (its machine was returned, or SIGKILL)
    else
        STATE=none
    fi
    local last="" elapsed=""
    [ -f "$DEST/logs/pretrain.log" ] && last=$(grep -E '^epoch ' "$DEST/logs/pretrain.log" | tail -n 1 || true)
    [ -f "$CTL/started" ] && elapsed=" after $(( $(date +%s) - $(cat "$CTL/started") ))s"
    case $STATE in
        none) echo "$METHOD: no detached run started in $CTL" ;;
        dead) echo "$METHOD: the detached run (pid $(cat "$CTL/pid")) is gone without a status; last: ${last:-no epoch finished}" ;;
        *) echo "$METHOD: $STATE$elapsed; last: ${last:-no epoch finished yet}" ;;
    esac
}

if [ "$MODE" = status ]; then
    report_status
    case $STATE in done|failed|stopped) exit 0 ;; running) exit 3 ;; *) exit 1 ;; esac
fi
if [ "$MODE" = collect ]; then
    report_status
    [ "$STATE" = none ] && { echo "error: nothing to collect: start it with scripts/train_reference.sh start $METHOD" >&2; exit 2; }
    RUN=$(cat "$CTL/run"); ARCHIVE=$(cat "$CTL/archive")
    if [ "$STATE" = running ] && [ "${STOP:-0}" = 1 ]; then
        echo "STOP=1: stopping the run (process group $(cat "$CTL/pid"))"
        kill -TERM -- "-$(cat "$CTL/pid")" 2>/dev/null || true
    fi
    WAITED=0
    while is_running && [ ! -f "$CTL/status" ]; do
        if [ -n "${WAIT_S:-}" ] && [ "$WAITED" -ge "$WAIT_S" ]; then
            report_status
            echo "still running after waiting ${WAITED}s: collect again later (or STOP=1 to stop it and export the last epoch)"
            exit 3
        fi
        sleep "${POLL_S:-10}"
        WAITED=$((WAITED + ${POLL_S:-10}))
        report_status
    done
    STATUS=$(cat "$CTL/status" 2>/dev/null || echo stopped)
    tail -n 5 "$DEST/logs/supervise.log" 2>/dev/null || true
fi

if [ "$MODE" != collect ]; then
    [ -f "$ARCHIVE" ] || { echo "error: $ARCHIVE not found (CIFAR-10 as JPEG ImageFolder archive with train/ and test/)" >&2; exit 2; }
    [ -f "$RECIPE" ] || { echo "error: no recipe $RECIPE" >&2; exit 2; }
fi
mkdir -p "$DEST/logs" "$DEST/reports" "$DEST/run"

if [ "$MODE" = start ]; then
    if is_running && [ ! -f "$CTL/status" ]; then
        echo "error: a detached $METHOD run is already going (pid $(cat "$CTL/pid")); see: scripts/train_reference.sh status $METHOD" >&2
        exit 2
    fi
    rm -rf "$CTL"
    mkdir -p "$CTL"
    printf '%s\n' "$RUN" >"$CTL/run"
    (cd "$(dirname "$ARCHIVE")" && printf '%s/%s\n' "$(pwd)" "$(basename "$ARCHIVE")") >"$CTL/archive"
    date +%s >"$CTL/started"
    # The supervisor is this script again (mode _supervise) in its own session: it runs the pretrain
    # under the same deadline loop as a foreground run and writes the outcome to $CTL/status.
    setsid bash "$ROOT/scripts/train_reference.sh" _supervise "$METHOD" "$@" >"$DEST/logs/supervise.log" 2>&1 </dev/null &
    echo $! >"$CTL/pid"
    echo "started $METHOD detached (pid $!): log $DEST/logs/pretrain.log"
    echo "next: scripts/train_reference.sh status $METHOD; scripts/train_reference.sh collect $METHOD"
    exit 0
fi

EXTRA=("$@")
# the caller's own options come last, so their --set schedule.warmup_epochs=... wins over the scaled one
[ "$MODE" != collect ] && [ -n "${EPOCHS:-}" ] && EXTRA=(--epochs "$EPOCHS" --set "schedule.warmup_epochs=$(scaled_warmup "$PY" "$RECIPE" "$EPOCHS")" ${EXTRA[@]+"${EXTRA[@]}"})
if [ "$MODE" != collect ]; then  # collect only exports and evaluates what the detached run left
    RESUME=()
    [ -f "$RUN/checkpoint.pt" ] && RESUME=(--resume)

    BUDGET_SHOWN=${BUDGET_S}s
    [ "$MODE" = _supervise ] && BUDGET_SHOWN=${BUDGET_S_GIVEN:-none}${BUDGET_S_GIVEN:+s}
    echo "== pretrain $METHOD ($RECIPE) -> $RUN, budget $BUDGET_SHOWN"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
    START=$(date +%s)
    # setsid: the run gets its own process group, so a deadline stops it (and only it) cleanly.
    setsid "${CLZOO[@]}" pretrain --recipe "$RECIPE" --data "$ARCHIVE" --val "$ARCHIVE" --out "$RUN" \
        --no-progress "${RESUME[@]}" "${EXTRA[@]}" >"$DEST/logs/pretrain.log" 2>&1 &
    PID=$!
    if [ "$MODE" = _supervise ]; then
        # `collect` with STOP=1 sends this supervisor SIGTERM: stop the run as a deadline would.
        stop_detached() {
            kill -TERM -- "-$PID" 2>/dev/null || true
            sleep 5
            kill -KILL -- "-$PID" 2>/dev/null || true
            echo stopped >"$CTL/status"
            exit 0
        }
        trap stop_detached TERM
        # A detached run's only deadline is the BUDGET_S given to `start` (none by default).
        supervise_pretrain "$PID" "$DEST/logs/pretrain.log" "$START" "$BUDGET_S_GIVEN" "${POLL_S:-10}" ""
        echo "$STATUS" >"$CTL/status"
        exit 0
    fi
    supervise_pretrain "$PID" "$DEST/logs/pretrain.log" "$START" "$BUDGET_S" "${POLL_S:-10}" ""
fi
if [ "$STATUS" != done ]; then
    [ -f "$RUN/checkpoint.pt" ] || { echo "error: no checkpoint to export" >&2; exit 1; }
    "$PY" -c "import sys; from cl_zoo.train.loop import export_run; print('exported', export_run(sys.argv[1]))" "$RUN"
fi
cp "$RUN"/recipe.yaml "$RUN"/metrics.csv "$DEST/run/" 2>/dev/null || true
cp "$RUN"/curves.png "$DEST/run/" 2>/dev/null || true

# Evaluation, float16 copy and its 0.1-point check: shared with the bundled default model.
PYTHON="$PY" bash "$ROOT/scripts/evaluate_and_bundle.sh" "$RUN/model" "$DEST" "$ARCHIVE" "$ARCHIVE"
