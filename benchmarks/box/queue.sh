#!/usr/bin/env bash
# queue.sh NAME JOBS: runs the benchmark commands of the file JOBS (lines "JOB<TAB>COMMAND"; JOB in letters, digits,
# '-' and '_') one after the other on a GPU box, from the rl_speed checkout it is started in:
#   1. benchmarks/box/setup.sh installs the wheel folders (from the checkout: they are not copied) and sets up the
#      bytecode cache; nothing runs if that fails;
#   2. the checkout (without .git and the wheel folders) is copied to /tmp/tree_NAME, so a later copy of the
#      checkout cannot change a queue that is running;
#   3. each job runs there, after any other queue's job ends (one lock): its output in BOX_RUNS/JOB.log (default
#      /tmp/runs) between "start" and "end" lines with Unix times, its exit status in BOX_RUNS/JOB.rc.
# The wheels are for the box's Python and come from where pip reaches an index, e.g. for a box with CPython 3.12:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl ale-py==0.12.1
# (Ray and each of its needs the box lacks likewise, into .ray_kit; BOX_WHEELS names other folders).
# Start it detached so that it outlives the command that started it, e.g.
#   setsid nohup bash benchmarks/box/queue.sh a jobs.tsv > /tmp/queue_a.out 2>&1 < /dev/null &
# then read the jobs' state with benchmarks/box/poll.sh.
set -u
name=${1:?usage: queue.sh NAME JOBS}
jobs=$(realpath "${2:?usage: queue.sh NAME JOBS}")
runs=${BOX_RUNS:-/tmp/runs}
here=$(dirname "$(realpath "$0")")
[[ $name =~ ^[A-Za-z0-9_-]+$ ]] || { echo "queue.sh: NAME '$name' must be letters, digits, '-' or '_'" >&2; exit 2; }
[ -f "$jobs" ] || { echo "queue.sh: no jobs file '$2'" >&2; exit 2; }
if bad=$(grep -v -E $'^([A-Za-z0-9_-]+\t.+)?$' "$jobs"); then
  echo "queue.sh: lines of $2 that are not JOB<TAB>COMMAND: $bad" >&2; exit 2
fi
source "$here/setup.sh" || exit 1
tree=/tmp/tree_$name
rm -rf "$tree" && mkdir -p "$tree" "$runs"
tar -C "$PWD" --exclude=./.git --exclude=./.ray_kit --exclude=./.whl -cf - . | tar -C "$tree" -xf -
cd "$tree"
export PYTHONPATH=$BOX_SITE:$tree:$tree/envs
while IFS=$'\t' read -r job command; do
  [ -z "$job" ] && continue
  exec 9> "$runs/queue.lock"
  flock 9
  echo "start $(date +%s.%N)" > "$runs/$job.log"
  bash -c "$command" >> "$runs/$job.log" 2>&1
  echo $? > "$runs/$job.rc"
  echo "end $(date +%s.%N)" >> "$runs/$job.log"
  exec 9>&-
done < "$jobs"
