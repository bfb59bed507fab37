#!/usr/bin/env bash
# examples/embed_engine as a user runs it: N iterations print N loss lines,
# numbered 1..N, every loss finite, the last below the first (it trains);
# two data-parallel devices give the one-device losses; bad input is one line
# on stderr and exit 1.
#
#   embed_engine_test.sh BUILD/bin/embed_engine
set -euo pipefail
engine=$1
iterations=8

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Runs embed_engine with "$@"; its stdout in $out, or the test fails.
run() {
  local rc=0
  out=$(timeout 30 "$engine" --iterations "$iterations" "$@") || rc=$?
  [ "$rc" -eq 0 ] || fail "embed_engine $* exited $rc; stdout: $out"
}

# The losses of the "iter I  loss L  grad_norm G" lines, one per line;
# fails unless there is one per iteration, in order, each a finite number.
losses() {
  awk -v n="$iterations" '
    /^iter / {
      count++
      if ($2 != count) { print "line " NR " is iteration " $2 ", expected " count > "/dev/stderr"; exit 1 }
      if ($3 != "loss" || $4 !~ /^[0-9]+\.[0-9]+$/) { print "not a finite loss: " $0 > "/dev/stderr"; exit 1 }
      print $4
    }
    END { if (count != n) { print count " loss lines, expected " n > "/dev/stderr"; exit 1 } }'
}

run --devices 1
one_device=$(losses <<<"$out") || fail "one device: $out"
grep -q "^trained $iterations iterations on 1 device(s)$" <<<"$out" || fail "no closing line: $out"
[ "$(wc -l <<<"$out")" -eq $((iterations + 1)) ] || fail "stdout holds other lines: $out"
first=$(head -n 1 <<<"$one_device")
last=$(tail -n 1 <<<"$one_device")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the loss did not fall: $first -> $last"

run --devices 2
two_devices=$(losses <<<"$out") || fail "two devices: $out"
# The same numbers up to floating-point reduction order (DESIGN §4).
paste <(echo "$one_device") <(echo "$two_devices") |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "iteration " NR ": " $1 " vs " $2; exit 1 } }' ||
  fail "two devices changed the losses"

# Bad input: one line on stderr naming the problem, and exit 1.
expect_error() {
  local pattern=$1
  shift
  local rc=0 stderr
  stderr=$(timeout 30 "$engine" "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq 1 ] || fail "$*: exited $rc"
  [ "$(wc -l <<<"$stderr")" -eq 1 ] || fail "$*: not one line: $stderr"
  grep -q "$pattern" <<<"$stderr" || fail "$*: '$stderr' does not match '$pattern'"
}
expect_error '^embed_engine: --iterations: ' --iterations 0
expect_error "'0x2' is not a decimal integer" --devices 0x2
expect_error '^embed_engine: --batch 3 is not a multiple of --devices 2$' --batch 3 --devices 2
expect_error '^embed_engine: --lr: nan is not in (0, 1] (see --help)$' --lr nan
expect_error '^embed_engine: --lr: 1e-400 is not in (0, 1] (see --help)$' --lr 1e-400

echo "PASS: $iterations finite losses, $first -> $last, the same on 2 devices"
