#!/usr/bin/env bash
# race_keep.sh NAME SEED CONTENDER [ARGS...]: one race run on a GPU box that keeps its trained module, for a queue
# file's line (benchmarks/box/queue.sh):
#   python -m benchmarks.race.race_atari contender CONTENDER --seed SEED --dir BOX_RUNS/NAME --checkpoint ARGS...
# then the run's module folder (benchmarks.common.checkpoint_module_dir) packed into BOX_POLICIES/NAME-SEED.tar
# (default /tmp/policies), small enough to bring back and evaluate off the box: extract it into the run's folder,
# then `python -m benchmarks.race.race_atari evaluate BOX_RUNS/NAME`. Lists any CUDA MPS daemon still running after
# the run (--cuda-mps stops its own); exits with the race's status.
set -u
name=${1:?usage: race_keep.sh NAME SEED CONTENDER [ARGS...]}
seed=${2:?usage: race_keep.sh NAME SEED CONTENDER [ARGS...]}
contender=${3:?usage: race_keep.sh NAME SEED CONTENDER [ARGS...]}
shift 3
runs=${BOX_RUNS:-/tmp/runs}
policies=${BOX_POLICIES:-/tmp/policies}
python3 -m benchmarks.race.race_atari contender "$contender" --seed "$seed" --dir "$runs/$name" --checkpoint "$@"
rc=$?
where=$(python3 - "$contender" "$seed" <<'PY'
import sys
from benchmarks.common import checkpoint_module_dir
from benchmarks.race.race_atari import slug
print(f"{slug(sys.argv[1])}-seed{sys.argv[2]}", checkpoint_module_dir("checkpoint").parent)
PY
)
read -r run module <<< "$where"
mkdir -p "$policies"
kept=$policies/$name-$seed.tar
if ! tar -C "$runs/$name/$run" -cf "$kept" "$module" 2> /dev/null; then
  rm -f "$kept"  # no half-written archive to be mistaken for a policy
  echo "race_keep.sh: no module kept: $runs/$name/$run/$module is missing" >&2
fi
sleep 2  # the daemon's exit
pgrep -a nvidia-cuda-mps || echo "no CUDA MPS daemon left"
exit $rc
