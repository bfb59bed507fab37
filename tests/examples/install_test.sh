#!/usr/bin/env bash
# The installed package as an embedding user meets it: `cmake --install`
# into an empty prefix, then examples/embed_engine and examples/embed_client
# copied out of the tree and built against that prefix alone
# (find_package(Tessera)); the installed embed_engine prints the losses of
# the one built in the tree, and the installed `tessera` runs.
#
#   install_test.sh CMAKE GENERATOR BUILD_DIR SOURCE_DIR IN_TREE_EMBED_ENGINE
set -euo pipefail
cmake=$1
generator=$2
build=$3
source=$4
in_tree_engine=$5

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || fail "cmake --install: $(tail -n 5 "$work/install.log")"
[ -x "$prefix/bin/tessera" ] || fail "no $prefix/bin/tessera"
"$prefix/bin/tessera" --version >/dev/null || fail "the installed tessera does not run"
[ -f "$prefix/include/tessera/train/engine.h" ] || fail "no train/engine.h under $prefix/include/tessera"
[ -f "$prefix/include/tessera/comm/proto/plan.pb.h" ] || fail "the generated plan.pb.h was not installed"
# Only headers and the libraries go in: no sources, no tests.
leftovers=$(find "$prefix/include" -type f ! -name '*.h')
[ -z "$leftovers" ] || fail "not headers: $leftovers"

# Built against the prefix only: CMAKE_PREFIX_PATH, no TESSERA_SOURCE_DIR.
for example in embed_engine embed_client; do
  cp -r "$source/examples/$example" "$work/$example"
  if ! "$cmake" -S "$work/$example" -B "$work/$example/build" -G "$generator" \
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1; then
    fail "configuring $example against $prefix: $(tail -n 20 "$work/configure.log")"
  fi
  grep -q "$source" "$work/$example/build/CMakeCache.txt" &&
    fail "$example's build refers to the checkout $source"
  "$cmake" --build "$work/$example/build" >"$work/build.log" 2>&1 ||
    fail "building $example against $prefix: $(tail -n 20 "$work/build.log")"
done

"$work/embed_client/build/embed_client" --help >/dev/null || fail "the installed embed_client's --help"
installed=$(timeout 60 "$work/embed_engine/build/embed_engine" --iterations 3 --devices 2) ||
  fail "the embed_engine built against the installed Tessera failed: $installed"
in_tree=$(timeout 60 "$in_tree_engine" --iterations 3 --devices 2)
[ "$installed" = "$in_tree" ] || fail "installed: $installed; in the tree: $in_tree"
grep -q '^trained 3 iterations on 2 device(s)$' <<<"$installed" || fail "no closing line: $installed"

# A version the package is not is refused by find_package.
mkdir "$work/old"
cat >"$work/old/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(wants_other_version LANGUAGES CXX)
find_package(Tessera 9.0 REQUIRED)
CMAKE
if "$cmake" -S "$work/old" -B "$work/old/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/old.log" 2>&1; then
  fail "find_package(Tessera 9.0) was satisfied by $(grep -o 'version: [0-9.]*' "$work/old.log" || echo '?')"
fi
grep -q 'TesseraConfig.cmake, version: [0-9]' "$work/old.log" || fail "the refusal does not name the package's version: $(cat "$work/old.log")"

echo "PASS: installed into $prefix, both examples built against it alone, the same losses as in the tree"
