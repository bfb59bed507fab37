#!/usr/bin/env bash
# Checks deploy/ against the binary it deploys (ctest -L deploy):
#
#  flags       every `tessera VERB --flag` written in deploy/, docs/cluster.md
#              and README.md is a flag `tessera VERB --help` lists;
#  install     `cmake --install` puts the binary where the units run it;
#  systemd     the units pass `systemd-analyze verify` (silently) and keep a
#              low exposure score, and a master and a worker started from
#              their ExecStart lines (paths moved into a temp dir, addresses
#              127.0.0.1 with ports the OS picks) register, serve /metrics,
#              run a job, and exit 0 on SIGTERM;
#  kubernetes  the manifests parse, hold the expected kinds and agree with
#              each other (check_manifests.py);
#  slurm       the sbatch script parses, is shellcheck-clean, and runs a job
#              end to end on this machine as a one-node allocation (srun and
#              scontrol stand-ins, 127.0.0.1);
#  docker      the runtime stage installs exactly the Debian packages that
#              own the binary's NEEDED libraries, and builds with options
#              CMakeLists.txt has.
#
# A part whose tool is missing (systemd-analyze, python3 with yaml, dpkg,
# the shellcheck linter) is skipped with the reason. Every process it starts is
# stopped on exit, failure or not.
#
# Usage: check_deploy.sh TESSERA_BINARY SOURCE_DIR BUILD_DIR
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 TESSERA_BINARY SOURCE_DIR BUILD_DIR" >&2
  exit 2
fi
bin=$(realpath "$1")
src=$(realpath "$2")
build_dir=$(realpath "$3")
deploy="$src/deploy"
here="$src/tests/deploy"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera_deploy.XXXXXX")
failures=0
pids=()
groups=()

cleanup() {
  local pid
  for pid in "${groups[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 30); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    for pid in "${groups[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${groups[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# forget PID: it has been waited for; cleanup must not signal its number,
# which the system may give to another process.
forget() {
  local kept=() pid
  for pid in "${pids[@]}"; do [ "$pid" = "$1" ] || kept+=("$pid"); done
  pids=("${kept[@]}")
  kept=()
  for pid in "${groups[@]}"; do [ "$pid" = "$1" ] || kept+=("$pid"); done
  groups=("${kept[@]}")
}

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
skip() { echo "SKIP: $*"; }
pass() { echo "ok: $*"; }

# until_true SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds
# or SECONDS pass.
until_true() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.1
  done
}

# up_or_exited PID COMMAND...: COMMAND succeeds, or PID is gone (waiting on
# longer would be in vain).
up_or_exited() {
  local pid=$1
  shift
  "$@" || ! kill -0 "$pid" 2> /dev/null
}

# exited_within SECONDS PID: waits for PID (a child) to exit and returns its
# status, or 124 if it is still running after SECONDS.
exited_within() {
  local pid=$2
  until_true "$1" bash -c "! kill -0 $pid 2>/dev/null" || return 124
  local status=0
  wait "$pid" || status=$?
  return "$status"
}

# ---------------------------------------------------------------- flags ----

verbs=$("$bin" --help | awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }')
if [ -z "$verbs" ]; then
  fail "no subcommands in '$bin --help'"
  verbs="master worker"
fi
mkdir -p "$tmp/help"
for verb in $verbs; do
  "$bin" "$verb" --help | grep -oE '^ +(-[[:alnum:]],)?--[a-z0-9-]+' | sed 's/.*--/--/' > "$tmp/help/$verb"
done
verb_pattern=$(echo "$verbs" | paste -sd '|')

# Prints "FILE:LINE VERB FLAG" for each --flag after `tessera VERB` in the
# files (one logical line: backslash continuations joined; up to ; | & ) or
# a backquote). `tessera` may be a path or "$TESSERA".
command_flags() {
  awk -v verbs="$verb_pattern" -v q="'" '
    BEGIN {
      name = "[Tt][Ee][Ss][Ss][Ee][Rr][Aa][\"" q "}]*[ \t]+"
      re = "(^|[^A-Za-z0-9_.-])" name "(" verbs ")([ \t\"" q "`]|$)"
      separators = "[ \t\"" q "]+"
    }
    {
      line = $0; start = FNR
      while (line ~ /\\$/ && (getline more) > 0) line = substr(line, 1, length(line) - 1) " " more
      rest = line
      while (match(rest, re)) {
        verb = substr(rest, RSTART, RLENGTH)
        sub("^.*" name, "", verb)
        sub("[ \t\"" q "`]$", "", verb)
        rest = substr(rest, RSTART + RLENGTH)
        command = rest
        if (match(command, /[;|&)`]/)) command = substr(command, 1, RSTART - 1)
        n = split(command, words, separators)
        for (i = 1; i <= n; i++) {
          if (match(words[i], /^--[a-z][a-z0-9-]*/)) print FILENAME ":" start " " verb " " substr(words[i], 1, RLENGTH)
        }
      }
    }' "$@"
}

# The environment file: TESSERA_MASTER_ARGS / TESSERA_WORKER_ARGS lines
# (comments too) hold flags of that verb, and comments name flags as
# `tessera VERB --flag` (command_flags reads those); a flag anywhere else is
# an error.
env_flags() {
  awk -v q="'" '
    {
      verb = ""
      if ($0 ~ /^[# \t]*TESSERA_MASTER_ARGS=/) verb = "master"
      else if ($0 ~ /^[# \t]*TESSERA_WORKER_ARGS=/) verb = "worker"
      else if ($0 ~ /[Tt][Ee][Ss][Ss][Ee][Rr][Aa][ \t]+[a-z]/) next
      n = split($0, words, "[ \t=\"" q "]+")
      for (i = 1; i <= n; i++) {
        if (match(words[i], /^--[a-z][a-z0-9-]*/)) {
          print FILENAME ":" FNR " " (verb == "" ? "UNATTRIBUTED" : verb) " " substr(words[i], 1, RLENGTH)
        }
      }
    }' "$1"
  command_flags "$1"
}

# check_flags WHAT MIN: reads "WHERE VERB FLAG" lines; each flag must be in
# VERB's --help, and there must be at least MIN of them.
check_flags() {
  local what=$1 min=$2 count=0 bad=0 where verb flag
  while read -r where verb flag; do
    count=$((count + 1))
    if [ ! -f "$tmp/help/$verb" ]; then
      fail "$where: $flag belongs to no tessera verb ($verb)"
      bad=1
    elif ! grep -qxF -- "$flag" "$tmp/help/$verb"; then
      fail "$where: 'tessera $verb' has no $flag"
      bad=1
    fi
  done
  if [ "$count" -lt "$min" ]; then
    fail "$what: found $count tessera flags, expected at least $min (is the extraction broken?)"
  elif [ "$bad" -eq 0 ]; then
    pass "$what: $count tessera flags, all accepted"
  fi
}

# (check_flags reads a process substitution, not a pipe: it must count
# failures in this shell.)
check_flags "systemd master unit" 5 < <(command_flags "$deploy/systemd/tessera-master.service")
check_flags "systemd worker unit" 6 < <(command_flags "$deploy/systemd/tessera-worker.service")
check_flags "systemd environment file" 8 < <(env_flags "$deploy/systemd/tessera.env")
check_flags "slurm script" 10 < <(command_flags "$deploy/slurm/tessera.sbatch")
check_flags "docs/cluster.md" 10 < <(command_flags "$src/docs/cluster.md")
check_flags "README.md" 3 < <(command_flags "$src/README.md")

# -------------------------------------------------------------- install ----

if "${CMAKE:-cmake}" --install "$build_dir" --prefix "$tmp/prefix" > "$tmp/install.log" 2>&1 &&
  [ -x "$tmp/prefix/bin/tessera" ]; then
  unit_binary=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$deploy/systemd/tessera-master.service")
  if [ "$unit_binary" = /usr/local/bin/tessera ] && grep -q 'install(TARGETS tessera RUNTIME DESTINATION bin)' "$src/apps/CMakeLists.txt"; then
    pass "install: cmake --install puts PREFIX/bin/tessera (the units run /usr/local/bin/tessera)"
  else
    fail "install: the units run '$unit_binary', not where 'cmake --install' (prefix /usr/local) puts it"
  fi
else
  fail "install: 'cmake --install $build_dir' did not install bin/tessera: $(tail -1 "$tmp/install.log")"
fi

# -------------------------------------------------------------- systemd ----

# unit_key UNIT KEY: the values of KEY= in UNIT, continuation lines joined.
unit_key() {
  awk -v key="$2" '
    {
      line = $0
      while (line ~ /\\$/ && (getline more) > 0) line = substr(line, 1, length(line) - 1) " " more
      if (index(line, key "=") == 1) print substr(line, length(key) + 2)
    }' "$1"
}

if command -v systemd-analyze > /dev/null; then
  mkdir -p "$tmp/units"
  for unit in tessera-master tessera-worker; do
    sed "s#/usr/local/bin/tessera#$bin#" "$deploy/systemd/$unit.service" > "$tmp/units/$unit.service"
  done
  # verify exits 0 on unknown keys and bad values: any output is a failure.
  if output=$(cd "$tmp/units" && systemd-analyze verify ./tessera-master.service ./tessera-worker.service 2>&1) &&
    [ -z "$output" ]; then
    pass "systemd-analyze verify: both units"
  else
    fail "systemd-analyze verify: $output"
  fi
  # --threshold counts in tenths of the printed level: 30 is 3.0 ("OK" ends
  # at 4.9); the units are at 1.7.
  for unit in tessera-master tessera-worker; do
    if output=$(systemd-analyze security --offline=true --threshold=30 "$tmp/units/$unit.service" 2>&1); then
      pass "systemd-analyze security: $unit $(echo "$output" | grep -o 'exposure level.*' | head -1)"
    else
      fail "systemd-analyze security: $unit is above exposure 3.0: $(echo "$output" | tail -1)"
    fi
  done
else
  skip "systemd-analyze verify/security: systemd-analyze is not installed"
fi

# What the test gives the units' variables: addresses and ports become
# 127.0.0.1 and ports the OS picks; the others keep the example's values.
# A variable not listed here fails the test rather than run with an address
# from the example file.
declare -A env_values=()
while IFS= read -r line; do
  [[ $line =~ ^[A-Z_][A-Z0-9_]*= ]] || continue
  env_values[${line%%=*}]=${line#*=}
done < "$deploy/systemd/tessera.env"
for var in "${!env_values[@]}"; do
  case $var in
    TESSERA_MASTER_LISTEN) env_values[$var]=127.0.0.1:0 ;;
    TESSERA_METRICS_PORT) env_values[$var]=0 ;;
    TESSERA_METRICS_HOST | TESSERA_NODE_ADDRESS) env_values[$var]=127.0.0.1 ;;
    TESSERA_WORKER_PORT) env_values[$var]=0 ;;
    TESSERA_MASTER) env_values[$var]=set-below ;;
    TESSERA_DEVICES | TESSERA_MASTER_ARGS | TESSERA_WORKER_ARGS) ;;
    *) fail "tessera.env: check_deploy.sh does not know $var (an address to move to 127.0.0.1, or a value to keep?)" ;;
  esac
done

# unit_command UNIT: the unit's ExecStart as words in the array `command`,
# the way systemd expands it: specifiers (%S state root, %d credentials, %H
# host name) into the temp dir, ${VAR} as one word, a lone $VAR split at
# whitespace. Also emulates StateDirectory= and LoadCredential=.
unit_command() {
  local unit=$1 name line word var value
  name=$(basename "$unit" .service)
  line=$(unit_key "$unit" ExecStart)
  command=()
  if [[ $line =~ [\"\'\\] || $line =~ ^[-@+!:] ]]; then
    fail "$name: ExecStart uses quotes or prefixes, which check_deploy.sh does not emulate: $line"
    return 1
  fi
  for dir in $(unit_key "$unit" StateDirectory); do mkdir -p "$tmp/state/$dir"; done
  mkdir -p "$tmp/credentials/$name"
  while IFS= read -r credential; do
    printf 'deploy-test-token\n' > "$tmp/credentials/$name/${credential%%:*}"
  done < <(unit_key "$unit" LoadCredential)
  line=${line//%S/$tmp/state}
  line=${line//%d/$tmp/credentials/$name}
  line=${line//%H/deploy-test-node}
  if [[ $line =~ %[a-zA-Z] ]]; then
    fail "$name: ExecStart uses a specifier check_deploy.sh does not emulate (${BASH_REMATCH[0]})"
    return 1
  fi
  line=${line//\/usr\/local\/bin\/tessera/$bin}
  for word in $line; do
    if [[ $word =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
      var=${BASH_REMATCH[1]}
      [ -v "env_values[$var]" ] || { fail "$name: \$$var is not in tessera.env"; return 1; }
      # shellcheck disable=SC2206  # split at whitespace, as systemd does
      command+=(${env_values[$var]})
      continue
    fi
    while [[ $word =~ \$\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do
      var=${BASH_REMATCH[1]}
      [ -v "env_values[$var]" ] || { fail "$name: \${$var} is not in tessera.env"; return 1; }
      value=${env_values[$var]}
      word=${word//\$\{$var\}/$value}
    done
    command+=("$word")
  done
}

# working_dir UNIT: where systemd would start it (WorkingDirectory=, else /,
# which the test replaces with a directory of its own).
working_dir() {
  local dir
  dir=$(unit_key "$1" WorkingDirectory)
  dir=${dir//%S/$tmp/state}
  if [ -z "$dir" ]; then dir="$tmp/cwd-$(basename "$1" .service)"; fi
  mkdir -p "$dir"
  echo "$dir"
}

status_lists_worker() {
  "$bin" status --master "$master_address" --token-file "$tmp/credentials/tessera-master/token" 2> /dev/null |
    grep -q '^worker deploy-test-node cpu:.* at 127\.0\.0\.1:[0-9]* (free)$'
}

metrics_text() {
  local port=$1
  exec 3<> "/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  cat <&3
  exec 3<&-
}

systemd_run() {
  local master_unit="$deploy/systemd/tessera-master.service" worker_unit="$deploy/systemd/tessera-worker.service"
  local master_dir worker_dir master_pid worker_pid metrics_port
  unit_command "$master_unit" || return 0
  local master_command=("${command[@]}")
  master_dir=$(working_dir "$master_unit")
  : > "$tmp/master.out"
  (cd "$master_dir" && exec "${master_command[@]}") > "$tmp/master.out" 2> "$tmp/master.err" &
  master_pid=$!
  pids+=("$master_pid")
  until_true 5 up_or_exited "$master_pid" grep -q '^master listening on ' "$tmp/master.out" || true
  if ! grep -q '^master listening on ' "$tmp/master.out"; then
    fail "systemd master: not listening within 5 s: $(tail -1 "$tmp/master.err")"
    return 0
  fi
  master_address=$(sed -n 's/^master listening on //p' "$tmp/master.out")
  metrics_port=$(sed -n 's#^metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics$#\1#p' "$tmp/master.out")
  if [[ ! $master_address =~ ^127\.0\.0\.1:[0-9]+$ ]] || [ -z "$metrics_port" ]; then
    fail "systemd master: serves on '$master_address', metrics port '$metrics_port' (expected 127.0.0.1 and one)"
    return 0
  fi
  env_values[TESSERA_MASTER]=$master_address

  unit_command "$worker_unit" || return 0
  local worker_command=("${command[@]}")
  cp "$tmp/credentials/tessera-master/token" "$tmp/credentials/tessera-worker/token"
  worker_dir=$(working_dir "$worker_unit")
  (cd "$worker_dir" && exec "${worker_command[@]}") > "$tmp/worker.out" 2> "$tmp/worker.err" &
  worker_pid=$!
  pids+=("$worker_pid")
  until_true 5 up_or_exited "$worker_pid" status_lists_worker || true
  if status_lists_worker; then
    pass "systemd: the worker's ExecStart registers with the master's as deploy-test-node (%H)"
  else
    fail "systemd: the worker did not register within 5 s: $(tail -1 "$tmp/worker.err")"
    return 0
  fi
  if metrics_text "$metrics_port" | grep -qx 'tessera_workers_alive 1'; then
    pass "systemd: /metrics on --metrics-host 127.0.0.1 says tessera_workers_alive 1"
  else
    fail "systemd: /metrics on 127.0.0.1:$metrics_port does not say tessera_workers_alive 1"
  fi

  # A job: the worker's devices run it; the master writes its relative
  # output_dir under its WorkingDirectory and its record in --state-dir.
  if timeout 15 "$bin" submit --master "$master_address" --token-file "$tmp/credentials/tessera-master/token" \
    "$src/configs/mlp_demo.json" train.train_iter=2 train.output_dir=deploy-test-output --follow \
    > "$tmp/submit.out" 2>&1; then
    if [ -s "$master_dir/deploy-test-output/metrics.jsonl" ] && compgen -G "$tmp/state/tessera/jobs/job-*.json" > /dev/null; then
      pass "systemd: a job ran; outputs in WorkingDirectory, its record in --state-dir"
    else
      fail "systemd: the job ran but $master_dir/deploy-test-output/metrics.jsonl or the job record is missing"
    fi
  else
    fail "systemd: the job did not succeed: $(tail -1 "$tmp/submit.out")"
  fi

  # systemctl stop sends SIGTERM: both exit 0, the worker first.
  stops_on_sigterm worker "$worker_pid"
  stops_on_sigterm master "$master_pid"
}

stops_on_sigterm() {
  local status=0
  kill -TERM "$2"
  exited_within 5 "$2" || status=$?
  [ "$status" -eq 124 ] || forget "$2"
  if [ "$status" -eq 0 ]; then
    pass "systemd: the $1 exits 0 on SIGTERM"
  else
    fail "systemd: the $1's exit status after SIGTERM is $status (124: still running after 5 s)"
  fi
}
systemd_run

# ----------------------------------------------------------- kubernetes ----

if /usr/bin/env python3 -c 'import yaml' 2> /dev/null; then
  if python3 "$here/check_manifests.py" "$deploy/kubernetes" > "$tmp/k8s_flags" 2> "$tmp/k8s.err"; then
    pass "kubernetes: manifests parse, hold the expected kinds and agree with each other"
    check_flags "kubernetes container args" 10 < "$tmp/k8s_flags"
  else
    while IFS= read -r line; do fail "$line"; done < "$tmp/k8s.err"
  fi
else
  skip "kubernetes: python3 with yaml (Debian's python3-yaml) is not installed"
fi
if command -v kubectl > /dev/null; then
  if kubectl kustomize "$deploy/kubernetes" > /dev/null 2> "$tmp/kustomize.err"; then
    pass "kubernetes: kubectl kustomize renders deploy/kubernetes"
  else
    fail "kubernetes: kubectl kustomize: $(tail -1 "$tmp/kustomize.err")"
  fi
fi

# ---------------------------------------------------------------- slurm ----

sbatch="$deploy/slurm/tessera.sbatch"
if bash -n "$sbatch"; then pass "slurm: bash -n"; else fail "slurm: bash -n $sbatch"; fi
if command -v shellcheck > /dev/null; then
  if shellcheck "$sbatch" "$0" > "$tmp/shellcheck.out"; then
    pass "slurm: shellcheck (the sbatch script and this one)"
  else
    fail "slurm: shellcheck: $(head -3 "$tmp/shellcheck.out")"
  fi
else
  skip "slurm: shellcheck is not installed"
fi

# A port no socket on this machine listens on (/proc/net/tcp{,6}), for the
# master the script starts (its workers' ports are the OS's).
free_port() {
  local port hex
  for _ in $(seq 50); do
    port=$((20000 + RANDOM % 40000))
    hex=$(printf '%04X' "$port")
    if ! awk '$4 == "0A" { print $2 }' /proc/net/tcp /proc/net/tcp6 2> /dev/null | grep -q ":$hex$"; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

# One node, 127.0.0.1: srun runs the step's command here, scontrol lists the
# node list. The script's own options must be --opt=value or --overlap.
slurm_run() {
  local fake="$tmp/fake-slurm" pid status port
  mkdir -p "$fake"
  cat > "$fake/srun" << 'EOF'
#!/usr/bin/env bash
while [ $# -gt 0 ] && [[ $1 == -* ]]; do
  [[ $1 == --*=* || $1 == --overlap ]] || { echo "fake srun: option '$1' is not --opt=value" >&2; exit 2; }
  shift
done
export SLURMD_NODENAME=127.0.0.1
exec "$@"
EOF
  cat > "$fake/scontrol" << 'EOF'
#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] || { echo "fake scontrol: only 'show hostnames'" >&2; exit 2; }
echo "$3" | tr ',' '\n'
EOF
  chmod +x "$fake/srun" "$fake/scontrol"
  port=$(free_port) || { fail "slurm: no free port found"; return 0; }
  PATH="$fake:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=127.0.0.1 SLURM_CPUS_ON_NODE=2 \
    TESSERA="$bin" TESSERA_PORT="$port" TESSERA_RUN_DIR="$tmp/slurm-run" TESSERA_WAIT_S=10 \
    setsid bash "$sbatch" "$src/configs/mlp_demo.json" train.train_iter=2 "train.output_dir=$tmp/slurm-output" \
    > "$tmp/slurm.out" 2>&1 &
  pid=$!
  groups+=("$pid")
  status=0
  exited_within 20 "$pid" || status=$?
  if [ "$status" -ne 0 ]; then
    fail "slurm: the script exited $status: $(tail -3 "$tmp/slurm.out" | paste -sd ' ')"
    return 0
  fi
  if ! grep -q '^tessera.sbatch: 1 workers registered' "$tmp/slurm.out" || [ ! -s "$tmp/slurm-output/metrics.jsonl" ]; then
    fail "slurm: the script exited 0 without registering its worker or writing the job's metrics"
  elif [ "$(stat -c %a "$tmp/slurm-run/token")" != 600 ]; then
    fail "slurm: the token file is mode $(stat -c %a "$tmp/slurm-run/token"), not 600"
  elif until_true 5 bash -c "! kill -0 -- -$pid 2>/dev/null"; then
    forget "$pid"
    pass "slurm: one-node run: master and worker started, the job SUCCEEDED, both stopped"
  else
    fail "slurm: processes of the script are still running after it exited"
  fi
}
slurm_run

# --------------------------------------------------------------- docker ----

dockerfile="$deploy/docker/Dockerfile"
while read -r option; do
  grep -qE "option\($option " "$src/CMakeLists.txt" || fail "docker: -D$option is not an option of CMakeLists.txt"
done < <(grep -oE -- '-DTESSERA_[A-Z_]+' "$dockerfile" | sed 's/^-D//' | sort -u)
uid=$(sed -n 's/.*useradd .*--uid \([0-9]*\).*/\1/p' "$dockerfile")
k8s_uids=$(grep -h 'runAsUser:' "$deploy"/kubernetes/*.yaml | awk '{print $2}' | sort -u || true)
if [ -z "$uid" ] || [ "$k8s_uids" != "$uid" ]; then
  fail "docker: the image's user (uid '$uid') is not the manifests' runAsUser ($k8s_uids)"
fi
grep -qx 'ENTRYPOINT \["tessera"\]' "$dockerfile" || fail "docker: ENTRYPOINT is not [\"tessera\"] (the manifests' args start with the verb)"

if command -v dpkg > /dev/null && command -v readelf > /dev/null; then
  # The packages of the runtime stage's apt-get install (after the last FROM).
  listed=$(awk '/^FROM /{ text = "" } { text = text "\n" $0 } END { print text }' "$dockerfile" |
    awk '{ line = $0; while (line ~ /\\$/ && (getline more) > 0) line = substr(line, 1, length(line) - 1) " " more; print line }' |
    grep 'apt-get install' | sed 's/.*apt-get install//; s/&&.*//' | tr ' ' '\n' | grep -v '^-' | grep . | sort -u || true)
  # NEEDED name -> path (ldd) -> package (one dpkg -S for all: it is slow).
  # On merged-/usr systems ldd may say /lib where dpkg has /usr/lib.
  declare -A lib_path=()
  while read -r name _ path _; do lib_path[$name]=$path; done < <(ldd "$bin" | grep ' => /')
  declare -A owner=()
  candidates=()
  for path in "${lib_path[@]}"; do candidates+=("$path" "/usr$path" "$(readlink -f "$path")"); done
  [ ${#candidates[@]} -gt 0 ] || fail "docker: ldd finds no libraries of $bin"
  while IFS= read -r line; do
    owner[${line#*: }]=${line%%:*}
  done < <(dpkg -S "${candidates[@]}" 2> /dev/null | grep -v '^diversion' || true)
  needed=""
  for lib in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    path=${lib_path[$lib]:-}
    package=""
    if [ -n "$path" ]; then
      for candidate in "$path" "/usr$path" "$(readlink -f "$path")"; do
        package=${owner[$candidate]:-}
        [ -n "$package" ] && break
      done
    fi
    if [ -z "$package" ]; then
      echo "note: docker: $lib (${path:-not found}) is from no Debian package (a CUDA build's library?): not checked"
      continue
    fi
    needed="$needed$package"$'\n'
  done
  needed=$(echo "$needed" | grep . | sort -u || true)
  missing=$(comm -23 <(echo "$needed") <(echo "$listed") | paste -sd ' ')
  extra=$(comm -13 <(echo "$needed") <(echo "$listed") | paste -sd ' ')
  if [ -z "$missing" ] && [ -z "$extra" ]; then
    pass "docker: the runtime stage installs exactly the $(echo "$needed" | wc -l) packages of the binary's NEEDED libraries"
  else
    fail "docker: runtime packages: missing [$missing], not needed [$extra]"
  fi
else
  skip "docker: dpkg or readelf is not installed (runtime packages not checked)"
fi
echo "note: docker: the image itself is not built here (no Docker daemon in CI)"

if [ "$failures" -ne 0 ]; then
  echo "check_deploy: $failures failure(s)"
  exit 1
fi
echo "check_deploy: all checks passed"
