# Sourced by .ci/run: each stage's wall time and the disk it leaves in build/ci/stages.csv, blocks of
# jobs run at once, and one closing summary line (with BUDGET EXCEEDED past CI_BUDGET_MINUTES).
# tests/test_ci_budget.py runs these functions in a folder of its own.
CI_BUDGET_MINUTES=${CI_BUDGET_MINUTES:-45}  # docs/ci.md; 90 is the hard limit
mkdir -p build/ci
STAGES=build/ci/stages.csv
echo "stage,seconds,disk_used_gb,disk_free_gb,block" >"$STAGES"
run_started=$(date +%s)
stage_name="" stage_started=$run_started
used_gb() { df --output=used -B1G . | tail -n 1 | tr -d ' '; }
free_gb() { df --output=avail -B1G . | tail -n 1 | tr -d ' '; }
# Peak disk: sampled every 5 s for the whole run (the py3.13 test's container peaks within a stage).
disk_at_start=$(used_gb)
( while kill -0 $$ 2>/dev/null; do used_gb; sleep 5; done ) >build/ci/disk_samples &  # ends with the run
disk_sampler=$!
# The running block's jobs and logs: an interrupted run stops their processes and shows their logs' ends.
block_pids=() block_names=() block_logs=()
end_stage() {
  [ -n "$stage_name" ] || return 0
  local now; now=$(date +%s)
  echo "${stage_name//,/;},$((now - stage_started)),$(used_gb),$(free_gb)," >>"$STAGES"  # a comma would split the row
  echo "-- stage '$stage_name': $((now - stage_started)) s; disk $(used_gb) GB used, $(free_gb) GB free"
  stage_name=""
}
stage() {  # stage NAME: ends the stage before, starts this one
  end_stage
  stage_name=$1 stage_started=$(date +%s)
  echo "== $1 ($(date -u +%H:%M:%S)) =="
}
# concurrently BLOCK NAME COMMAND [NAME COMMAND ...]: the commands at once, each its own job with its
# log in build/ci/; each job's end is said as it comes, then every log is shown whole, in order. Work
# that waits on Docker, pip or one emulated core shares the 2 cores this way. Fails if any job did.
concurrently() {
  local block=$1; shift
  stage "$block"
  block_pids=() block_names=() block_logs=()
  local -n names=block_names pids=block_pids logs=block_logs
  local starts=() n=0 failed=0
  while [ $# -gt 0 ]; do
    local log="build/ci/job-$n.log"
    names+=("$1") logs+=("$log") starts+=("$(date +%s)")
    ( set -e; eval "$2" ) >"$log" 2>&1 &
    pids+=($!)
    echo "   started: $1 (log $log)"
    n=$((n + 1)); shift 2
  done
  # polled, not `wait -n`: bash 5.2 says "no such job" for a listed job that ended before the call
  local running=("${!pids[@]}")
  while [ "${#running[@]}" -gt 0 ]; do
    local still=()
    for i in "${running[@]}"; do
      if kill -0 "${pids[$i]}" 2>/dev/null; then
        still+=("$i")
        continue
      fi
      local rc=0 took=$(( $(date +%s) - starts[i] ))
      wait "${pids[$i]}" || rc=$?
      echo "${names[$i]//,/;},$took,$(used_gb),$(free_gb),${block//,/;}" >>"$STAGES"
      echo "   ended: ${names[$i]} after $took s (exit $rc)"
      [ "$rc" -eq 0 ] || failed=1
    done
    running=("${still[@]}")
    [ "${#running[@]}" -eq 0 ] || sleep 1
  done
  for i in "${!names[@]}"; do
    echo "---- ${names[$i]}: its log ----"
    cat "${logs[$i]}"
  done
  block_pids=() block_names=() block_logs=()
  end_stage
  return "$failed"
}
stop_tree() {  # stop_tree PID: the process and everything it started (nox -> pip, docker build ...)
  local child
  for child in $(pgrep -P "$1"); do stop_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
stop_block() {  # an interrupted block: its jobs stopped, the end of each log shown
  local i
  for i in "${!block_pids[@]}"; do
    kill -0 "${block_pids[$i]}" 2>/dev/null || continue
    stop_tree "${block_pids[$i]}"
    echo "---- ${block_names[$i]}: stopped; the end of its log ----"
    tail -n 40 "${block_logs[$i]}"
  done
}
summary() {
  local rc=$? total peak slowest
  stop_block
  end_stage
  kill "$disk_sampler" 2>/dev/null || true
  total=$(( $(date +%s) - run_started ))
  peak=$(sort -n build/ci/disk_samples | tail -n 1)
  # the blocks' jobs overlap: the slowest stages are the sequential stages and the blocks as a whole
  slowest=$(tail -n +2 "$STAGES" | awk -F, '$5 == ""' | sort -t, -k2,2nr | head -n 3 \
    | awk -F, '{printf "%s%s %.1f min", s, $1, $2/60; s="; "}')
  echo "== CI summary: $(awk "BEGIN{printf \"%.1f\", $total/60}") min (rc $rc); slowest: $slowest; peak disk" \
       "$peak GB used ($((peak - disk_at_start)) GB over the checkout's $disk_at_start);" \
       "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores =="
  if [ "$total" -gt $((CI_BUDGET_MINUTES * 60)) ]; then
    echo "BUDGET EXCEEDED: $((total / 60)) min against a budget of $CI_BUDGET_MINUTES (90 is the hard limit; docs/ci.md)"
  fi
  [ -n "$started_dockerd" ] && kill "$started_dockerd" 2>/dev/null || true
}
started_dockerd=""
trap summary EXIT
trap 'exit 130' INT  # so that the EXIT trap runs: the summary, and the jobs stopped
trap 'exit 143' TERM

