#!/bin/bash
# The README's two commands from clean clones, with the machine made busy (not part of the suite; issues 13 and 21):
# `make test` twice in a row beside two `python -c "while True: pass"` (started and ended by PID), then the DDP stress
# check idle and busy (scripts/stress_ddp.py, 30 + 30), then `make demo` in a second clean clone. One summary line per
# step in $LOG/summary.txt, each command's output beside it.
#     scripts/clean_clone_check.sh [commit, default HEAD] [work folder, default /tmp/clean_clone_check]
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
COMMIT=$(git -C "$REPO" rev-parse "${1:-HEAD}")
WORK=${2:-/tmp/clean_clone_check}
LOG=$WORK/logs
rm -rf "$WORK"; mkdir -p "$LOG/stress"
for clone in a b; do git clone -q "$REPO" "$WORK/$clone" && git -C "$WORK/$clone" checkout -q "$COMMIT"; done
say() { echo "$* ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$LOG/summary.txt"; }
say "commit ${COMMIT:0:7}"
python3 -c "while True: pass" & B1=$!
python3 -c "while True: pass" & B2=$!
say "busy pids $B1 $B2"
for i in 1 2; do
  s=$(date +%s)
  (cd "$WORK/a" && make test) > "$LOG/test$i.log" 2>&1; rc=$?
  say "make test run $i: rc=$rc in $(( $(date +%s) - s )) s; $(tail -1 "$LOG/test$i.log"); git status: $(git -C "$WORK/a" status --porcelain | wc -l) lines"
done
kill $B1 $B2; wait $B1 $B2 2>/dev/null
say "busy processes ended"
(cd "$WORK/a" && .venv/bin/python scripts/stress_ddp.py --runs 30 --busy 0 2 --log-dir "$LOG/stress") > "$LOG/stress.log" 2>&1; rc=$?
say "stress_ddp rc=$rc: $(tail -1 "$LOG/stress.log"); git status: $(git -C "$WORK/a" status --porcelain | wc -l) lines"
s=$(date +%s)
(cd "$WORK/b" && make demo) > "$LOG/demo.log" 2>&1; rc=$?
say "make demo (second clone, own venv): rc=$rc in $(( $(date +%s) - s )) s; git status: $(git -C "$WORK/b" status --porcelain | wc -l) lines"
