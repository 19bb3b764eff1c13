#!/usr/bin/env bash
# poll.sh [TARBALL]: each started job's state (its exit status, or "running") and the last TAILC (default
# 600) characters of its log, oldest first; then everything under BOX_RUNS (default /tmp/runs) but checkpoints packed
# into TARBALL when one is given (e.g. "$OUT/runs.tgz" to bring the runs back from a box).
runs=${BOX_RUNS:-/tmp/runs}
for log in $(ls -tr "$runs"/*.log 2>/dev/null); do
  job=$(basename "$log" .log)
  echo "=== $job rc=$(cat "$runs/$job.rc" 2>/dev/null || echo running)"
  tail -c "${TAILC:-600}" "$log"; echo
done
if [ -n "${1:-}" ]; then
  tar -C "$(dirname "$runs")" -czf "$1" --exclude='*/checkpoint*' "$(basename "$runs")" && ls -la "$1"
fi
