#!/usr/bin/env bash
# examples/embed_client against real daemons: a `tessera master` and one
# `tessera worker --devices cpu:2` on 127.0.0.1 (ports the OS picks), with a
# token. The client prints one metrics line per iteration and SUCCEEDED and
# exits 0; a config the master refuses, a missing token or config file, a job
# that fails (its worker killed) and a master that is gone are one line on
# stderr and exit 1. The daemons are stopped on every exit.
#
#   embed_client_test.sh BUILD/bin/embed_client BUILD/bin/tessera configs/gpt2_nano.json
set -euo pipefail
client=$1
tessera=$2
config=$3
iterations=4

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera_embed_client.XXXXXX")
daemons=()
cleanup() {
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for log in "$work"/*.log; do
    [ -e "$log" ] && sed "s|^|$(basename "$log"): |" "$log" >&2
  done
  exit 1
}

# Polls `$1` (a command) every 0.1 s until it succeeds or 20 s have passed.
# (Every wait in this script is bounded, so a hang fails the test here, and
# the trap stops the daemons, well before ctest's TIMEOUT.)
wait_for() {
  local deadline=$((SECONDS + 20))
  until eval "$1"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out waiting for: $2"
    sleep 0.1
  done
}

echo "embed-client-test-token" >"$work/token"
"$tessera" master --listen 127.0.0.1:0 --token-file "$work/token" >"$work/master.log" 2>&1 &
master_pid=$!
daemons+=("$master_pid")
# It prints "master listening on 127.0.0.1:PORT" once it serves.
wait_for 'grep -q "^master listening on " "$work/master.log" || ! kill -0 $master_pid' "the master to listen"
address=$(sed -n 's/^master listening on //p' "$work/master.log")
[ -n "$address" ] || fail "the master did not start"

"$tessera" worker --master "$address" --devices cpu:2 --token-file "$work/token" >"$work/worker.log" 2>&1 &
worker_pid=$!
daemons+=("$worker_pid")
wait_for '"$tessera" status --master "$address" --token-file "$work/token" 2>/dev/null | grep -q "^worker .* cpu:2 "' \
  "the worker to register"

# ---- a job that succeeds: one metrics line per iteration, then SUCCEEDED ----
rc=0
timeout 25 "$client" --master "$address" --token-file "$work/token" "$config" "train.train_iter=$iterations" train.log_period=1 \
  train.dist.data_parallel_size=2 train.dist.intra_op_threads=1 "train.output_dir=$work/out" \
  >"$work/client.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "embed_client exited $rc"
grep -q '^submitted job-' "$work/client.log" || fail "no job id"
awk -v n="$iterations" '
  /^iter / {
    count++
    if ($2 != count || $3 != "loss" || $4 !~ /^[0-9]+\.[0-9]+$/ || $7 != "samples/s") { print "bad line: " $0; exit 1 }
  }
  END { if (count != n) { print count " metrics lines, expected " n; exit 1 } }' "$work/client.log" ||
  fail "metrics lines"
tail -n 1 "$work/client.log" | grep -q '^job-[0-9]* SUCCEEDED$' || fail "the last line is not SUCCEEDED"

# ---- refused before a job exists: one line on stderr and exit 1 ----
expect_error() {
  local what=$1 pattern=$2
  shift 2
  local rc=0 stderr
  stderr=$(timeout 25 "$client" "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq 1 ] || fail "$what: exited $rc"
  [ "$(wc -l <<<"$stderr")" -eq 1 ] || fail "$what: not one line: $stderr"
  grep -q "$pattern" <<<"$stderr" || fail "$what: '$stderr' does not match '$pattern'"
}
expect_error "a misspelled key" "^embed_client: the master at $address refused the job: .*did you mean 'train.train_iter'" \
  --master "$address" --token-file "$work/token" "$config" train.train_iters=3
expect_error "no token" "^embed_client: the master at $address refused the job: " --master "$address" "$config"
expect_error "a missing config file" "^embed_client: .*no-such-config.json" \
  --master "$address" "$work/no-such-config.json"

# ---- a job that fails: its worker is killed while it runs ----
timeout 25 "$client" --master "$address" --token-file "$work/token" "$config" train.train_iter=100000 \
  train.log_period=1 train.dist.data_parallel_size=2 train.dist.intra_op_threads=1 "train.output_dir=$work/out2" \
  >"$work/doomed.log" 2>"$work/doomed.err" &
doomed_pid=$!
wait_for 'grep -q "^iter " "$work/doomed.log"' "the second job to report metrics"
kill -KILL "$worker_pid"
wait "$worker_pid" 2>/dev/null || true  # (bash would print "Killed")
rc=0
wait "$doomed_pid" || rc=$?
[ "$rc" -eq 1 ] || fail "embed_client of a failed job exited $rc"
[ "$(wc -l <"$work/doomed.err")" -eq 1 ] || fail "a failed job: not one line on stderr"
grep -q '^embed_client: job job-[0-9]* FAILED: .*worker' "$work/doomed.err" || fail "a failed job: $(cat "$work/doomed.err")"

# The master stops; nothing listens at its address any more.
kill "$master_pid"
wait "$master_pid" || true
expect_error "no master" "^embed_client: no master answers at $address: " \
  --master "$address" --token-file "$work/token" "$config"

echo "PASS: $iterations metrics lines and SUCCEEDED; refused, unauthenticated, missing, failed and unreachable are one line"
