# Sourced by scripts/train_reference.sh and scripts/train_cpu_tier.sh: watch a detached
# `cl-zoo pretrain` and stop it at a deadline, so both drivers share one loop.
#
#   supervise_pretrain PID LOG START BUDGET_S POLL_S HINT
# PID: the run started with setsid (its own process group); LOG: its log, whose last `epoch` line is
# printed every POLL_S seconds; START: its start (date +%s); BUDGET_S: seconds allowed, empty for no
# deadline; HINT: appended to the "budget reached" line. Sets STATUS to done, failed or stopped.
supervise_pretrain() {
    local pid=$1 log=$2 start=$3 budget=$4 poll=$5 hint=$6 now
    STATUS=running
    while kill -0 "$pid" 2>/dev/null; do
        sleep "$poll" &
        wait $! || true
        now=$(date +%s)
        echo "[$((now - start))s] $(grep -E '^epoch ' "$log" | tail -n 1 || true)"
        if [ -n "$budget" ] && [ $((now - start)) -ge "$budget" ]; then
            echo "budget reached: stopping the run (process group $pid)$hint"
            kill -TERM -- "-$pid" 2>/dev/null || true
            sleep 5
            kill -KILL -- "-$pid" 2>/dev/null || true
            STATUS=stopped
            break
        fi
    done
    if [ "$STATUS" = running ]; then
        if wait "$pid"; then STATUS=done; else STATUS=failed; fi
    fi
    tail -n 5 "$log"
    echo "pretraining $STATUS after $(( $(date +%s) - start ))s"
}

# scaled_warmup PY RECIPE EPOCHS: the recipe's warm-up epochs scaled to a schedule shortened to EPOCHS
# (SiMo's 10 of 200 -> 0.4 of 8), so a run cut to fit a machine keeps the recipe's shape instead of
# being refused for a warm-up longer than the whole run.
scaled_warmup() {
    "$1" -c "import sys; from cl_zoo.train.recipe import Recipe; r = Recipe.load(sys.argv[1]); print(round(r.schedule.warmup_epochs * int(sys.argv[2]) / r.epochs, 3))" "$2" "$3"
}
