#!/usr/bin/env bash
# 5 consecutive `CI=true .ci/run` in a fresh clone of HEAD while two busy loops keep both cores loaded.
set -u
rm -rf /tmp/ci/tree && git clone -q "$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)" /tmp/ci/tree && cd /tmp/ci/tree
echo "commit $(git rev-parse --short HEAD)" > /tmp/ci/summary.txt
python3 -c "while True: pass" & L1=$!
python3 -c "while True: pass" & L2=$!
trap 'kill $L1 $L2' EXIT
for i in 1 2 3 4 5; do
  t0=$(date +%s)
  CI=true .ci/run > /tmp/ci/run$i.log 2>&1; rc=$?
  echo "run $i rc=$rc $(( $(date +%s) - t0 )) s load $(cut -d' ' -f1-3 /proc/loadavg) $(grep -E '[0-9]+ passed' /tmp/ci/run$i.log | tail -1)" >> /tmp/ci/summary.txt
  [ $rc -ne 0 ] && break
done
echo done >> /tmp/ci/summary.txt
