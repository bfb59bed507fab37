#!/usr/bin/python3
"""GPT-2's byte-level BPE in plain Python (no PyTorch, no tokenizer package):
the reference side of bench/preprocess_compare.sh, written from the
algorithm (bytes mapped to printable characters, the pre-tokenizer pattern,
then the lowest-ranked merge first, with a per-word cache).

  bpe_python.py ENCODER_JSON VOCAB_BPE TEXT_FILE

prints "tokens N", "seconds S" (encoding only, after reading the files) and
"mb_per_s X". Python's `re` has no \\p{L} / \\p{N}: letters are [^\\W\\d_] and
numbers \\d, the same on the English corpus the comparison runs (the token
counts of both sides are compared).
"""

import json
import re
import sys
import time


def byte_to_char():
    """The 256 bytes as printable characters: the printable Latin-1 ones as
    themselves, the others shifted past 255, in order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


class Bpe:
    def __init__(self, encoder_path, merges_path):
        with open(encoder_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        pairs = [tuple(line.split()) for line in lines[1:] if line and not line.startswith("#")]
        self.ranks = {pair: i for i, pair in enumerate(pairs)}
        self.bytes = byte_to_char()
        self.cache = {}

    def word(self, token):
        if token in self.cache:
            return self.cache[token]
        parts = list(token)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                rank = self.ranks.get((parts[i], parts[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = i, rank
            if best is None:
                break
            merged = parts[best] + parts[best + 1]
            # Every occurrence of the pair, left to right.
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == parts[best] and parts[i + 1] == parts[best + 1]:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        ids = [self.encoder[p] for p in parts]
        self.cache[token] = ids
        return ids

    def encode(self, text):
        ids = []
        for piece in PATTERN.findall(text):
            ids.extend(self.word("".join(self.bytes[b] for b in piece.encode("utf-8"))))
        return ids


def main():
    encoder, merges, text_file = sys.argv[1:4]
    bpe = Bpe(encoder, merges)
    with open(text_file, encoding="utf-8") as f:
        text = f.read()
    begin = time.perf_counter()
    # Documents as `tessera preprocess` cuts a .txt file: paragraphs between
    # blank lines.
    tokens = sum(len(bpe.encode(doc)) for doc in re.split(r"\n[ \t]*\n", text) if doc.strip())
    seconds = time.perf_counter() - begin
    size = len(text.encode("utf-8"))
    print(f"tokens {tokens}")
    print(f"seconds {seconds:.3f}")
    print(f"mb_per_s {size / seconds / 1e6:.2f}")


if __name__ == "__main__":
    main()
