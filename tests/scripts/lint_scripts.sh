#!/bin/bash
# The repository's shell scripts parse (bash -n) and, where shellcheck is
# installed, have no finding at warning level or above. scripts/gpu_check.sh
# runs once on a lent GPU machine: a script that breaks there costs the
# issue's device time, so it is checked here on every CI run.
#   lint_scripts.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: lint_scripts.sh SOURCE_DIR}
scripts=("$root"/scripts/*.sh "$root"/.ci/run "$root"/tests/deploy/check_deploy.sh "$0")
failed=0
for f in "${scripts[@]}"; do
  if ! bash -n "$f"; then
    echo "FAILED: bash -n $f"
    failed=1
  fi
done
if command -v shellcheck > /dev/null; then
  if ! shellcheck -S warning "${scripts[@]}"; then
    echo "FAILED: shellcheck -S warning"
    failed=1
  fi
else
  echo "skipped: shellcheck is not installed (bash -n only)"
fi
[[ $failed == 0 ]] && echo "${#scripts[@]} scripts: passed"
exit "$failed"
