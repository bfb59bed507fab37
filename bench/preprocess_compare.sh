#!/bin/bash
# `tessera preprocess --tokenizer gpt2` against GPT-2's BPE in plain Python
# (bench/bpe_python.py, the script's own loop), on the same text file:
# MB/s of each and the ratio (report only). Tessera's figures: the whole
# process (start-up included), and the verb's own timing line (read,
# tokenise on THREADS threads, write the indexed dataset); Python's is the
# encoding alone, one thread. The
# token counts are compared (Tessera's includes one end-of-document token per
# document).
# Builds nothing: build tessera first (Release).
#
#   bench/preprocess_compare.sh [BUILD_DIR] [TEXT_FILE] [THREADS]
#       (defaults: build, $TESSERA_CACHE/corpus/kjv.txt, 2)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
cache=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
text=${2:-$cache/corpus/kjv.txt}
threads=${3:-2}
python=${PYTHON:-/usr/bin/python3}
tessera="$build/bin/tessera"
[[ -x $tessera ]] || { echo "preprocess_compare: $tessera not built" >&2; exit 1; }
[[ -r $text ]] || { echo "preprocess_compare: no text file $text (scripts/setup_data.sh puts the KJV there)" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
size=$(stat -c %s "$text")
begin=$(date +%s.%N)
"$tessera" preprocess --input "$text" --tokenizer gpt2 --output "$out/data" --threads "$threads" > "$out/log" 2>&1 ||
  { cat "$out/log" >&2; exit 1; }
end=$(date +%s.%N)
ours=$(awk -v s="$size" -v a="$begin" -v b="$end" 'BEGIN { printf "%.2f", s / (b - a) / 1e6 }')
# "wrote P.bin and P.idx: D documents, S sequences, N tokens from ..."
ours_tokens=$(sed -nE 's/.* ([0-9]+) tokens from .*/\1/p' "$out/log")
ours_docs=$(sed -nE 's/.*: ([0-9]+) documents, .*/\1/p' "$out/log")
# Its own figure, without the process's start-up: "... in T s (X MB/s)".
ours_own=$(sed -nE 's/.*\(([0-9.]+) MB\/s\)$/\1/p' "$out/log")
"$python" "$here/bpe_python.py" "$cache/gpt2/encoder.json" "$cache/gpt2/vocab.bpe" "$text" > "$out/python"
py=$(awk '$1 == "mb_per_s" { print $2 }' "$out/python")
py_tokens=$(awk '$1 == "tokens" { print $2 }' "$out/python")
echo "text: $text ($size bytes)"
echo "tessera preprocess ($threads threads): $ours MB/s the whole process, $ours_own MB/s by its own timing, $ours_tokens tokens ($ours_docs end-of-document tokens among them)"
echo "python loop (1 thread, encoding only): $py MB/s, $py_tokens tokens"
awk -v o="$ours" -v w="$ours_own" -v p="$py" 'BEGIN { printf "ratio: %.1fx (the whole process), %.1fx (its own timing)\n", o / p, w / p }'
