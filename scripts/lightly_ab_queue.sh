#!/usr/bin/env bash
# Issue 39's CPU A/B (benchmarks/lightly_ab.py) as one detached, resumable queue: lightly's reference and
# every one-factor change of our loop, seed by seed (all factors of seed 0 first, so a queue stopped
# early still leaves a complete one-seed table).
#
#   scripts/lightly_ab_queue.sh start      # detached (setsid nohup); the log is $AB_WORK/queue.log
#   scripts/lightly_ab_queue.sh status     # running or not, runs done, the table so far
#   scripts/lightly_ab_queue.sh stop       # ends the queue's process group (its own pid file only)
#   scripts/lightly_ab_queue.sh run        # the same queue in the foreground
#
# A run is done when $AB_WORK/results.jsonl holds its line (lightly_ab.py --skip-done), so the queue can
# be stopped and started again at any time; an interrupted run starts over (runs have no checkpoints).
# A run that fails is skipped until its flag $AB_WORK/failed.<side>.<factor>.<seed> is removed.
# Run it from a worktree nobody edits (git worktree add --detach ../ab-tree HEAD), as scripts/tier_queue.sh
# says: a run imports parts of cl_zoo lazily, and an edit under it can kill it.
# Two shared cores train one run at a time; anything else on the machine slows it.
# Sizing (measured 2026-11-27 under a load average of 12-17 on 2 cores, so an upper bound): at width 0.25 and
# batch 256 a step took 32 s (lightly: PIL transforms in one worker) / 24 s (ours) -> 19 steps, about 8-10 min per
# epoch of 5,000 images, 2-2.5 h per 15-epoch run, 33 runs for 11 factors x 3 seeds; on an idle machine expect several
# times less. At full width (1.0) a step of 64 images took 27 s (lightly) / 28 s (ours).
# On a quiet 2-core EPYC (2026-11-27) the table in docs/results.md ran at AB_EPOCHS=16 AB_WIDTH=0.25 AB_BATCH=128
# AB_TRAIN_PER_CLASS=250 AB_TEST_PER_CLASS=200: 9-12 s an epoch on either side, 3.3-4 min a run, 20 runs in about 2 h.
# Anything else on the machine (tests, a second trainer) slows it several times: two OpenMP runs on two cores fight.
#
# Environment (defaults in brackets): AB_WORK [runs/lightly_ab], AB_SEEDS ["0 1 2"], AB_EPOCHS [15], AB_WIDTH [0.25],
# AB_BATCH [256], AB_TRAIN_PER_CLASS [500], AB_TEST_PER_CLASS [200], AB_FACTORS [every factor, the
# decisive ones first], AB_THREADS [2], AB_WORKERS [1].
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
WORK=${AB_WORK:-$ROOT/runs/lightly_ab}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
# The runs import this tree's cl_zoo: an editable install (PYTHON=../main/.venv/bin/python from a worktree)
# would otherwise import its own checkout, edits and all (each result line records which, as "cl_zoo").
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
SEEDS=${AB_SEEDS:-0 1 2}
FACTORS=${AB_FACTORS:-"lightly:reference ours:baseline ours:old_recipe ours:per_view ours:aug_lightly ours:backbone_lightly ours:head_lightly ours:warmup ours:old_lr ours:wd_groups ours:loss_lightly"}
SIZE=(--epochs "${AB_EPOCHS:-15}" --width "${AB_WIDTH:-0.25}" --batch-size "${AB_BATCH:-256}" --train-per-class "${AB_TRAIN_PER_CLASS:-500}"
      --test-per-class "${AB_TEST_PER_CLASS:-200}" --threads "${AB_THREADS:-2}" --workers "${AB_WORKERS:-1}"
      --results "$WORK/results.jsonl")
PIDFILE=$WORK/queue.pid

run_queue() {
    for seed in $SEEDS; do
        for item in $FACTORS; do
            side=${item%%:*}
            factor=${item#*:}
            flag=$WORK/failed.$side.$factor.$seed
            if [ -e "$flag" ]; then
                echo "skip (failed before; remove $flag to retry): $side $factor seed $seed"
                continue
            fi
            echo "$(date -u +%FT%TZ) start $side $factor seed $seed"
            if ! "$PY" benchmarks/lightly_ab.py --side "$side" --factor "$factor" --seed "$seed" "${SIZE[@]}" --skip-done; then
                echo "$(date -u +%FT%TZ) FAILED $side $factor seed $seed"
                touch "$flag"
            fi
        done
    done
    echo "$(date -u +%FT%TZ) queue finished"
    "$PY" benchmarks/lightly_ab.py --table --results "$WORK/results.jsonl"
}

running() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

case "${1:-}" in
    start)
        if running; then echo "already running (pid $(cat "$PIDFILE")); log: $WORK/queue.log"; exit 0; fi
        setsid nohup bash "$0" run >> "$WORK/queue.log" 2>&1 < /dev/null &
        echo $! > "$PIDFILE"
        echo "started (pid $!); log: $WORK/queue.log; results: $WORK/results.jsonl"
        ;;
    run)
        run_queue
        ;;
    status)
        if running; then echo "running (pid $(cat "$PIDFILE"))"; else echo "not running"; fi
        [ -f "$WORK/results.jsonl" ] && echo "runs done: $(grep -c . "$WORK/results.jsonl")"
        "$PY" benchmarks/lightly_ab.py --table --results "$WORK/results.jsonl"
        ;;
    stop)
        if running; then kill -- -"$(cat "$PIDFILE")" && echo "stopped"; else echo "not running"; fi
        ;;
    *)
        echo "usage: $0 start|status|stop|run" >&2
        exit 2
        ;;
esac
