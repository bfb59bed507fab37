#!/usr/bin/env python3
"""An independent reader and writer of Megatron-LM's MMapIndexedDataset files.

Written from the format as Megatron's megatron/core/datasets/indexed_dataset.py
reads and writes it (header through `struct`, arrays through numpy views of a
memory map), so that dataset_test can check Tessera's files against it both
ways, and Tessera's split boundaries against get_train_valid_test_split_.

  megatron_indexed_dataset.py read PREFIX            -> JSON on stdout
  megatron_indexed_dataset.py write PREFIX VOCAB CORPUS.json
  megatron_indexed_dataset.py splits CASES.txt       -> one line per case
"""
import json
import struct
import sys

import numpy

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32,
          5: numpy.int64, 6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


def code_of(dtype):
    return next(code for code, candidate in DTYPES.items() if candidate == dtype)


def read(prefix):
    with open(prefix + ".idx", "rb") as stream:
        assert stream.read(9) == MAGIC, "bad magic"
        (version,) = struct.unpack("<Q", stream.read(8))
        assert version == 1, "bad version"
        (code,) = struct.unpack("<B", stream.read(1))
        (num_sequences,) = struct.unpack("<Q", stream.read(8))
        (num_entries,) = struct.unpack("<Q", stream.read(8))
        offset = stream.tell()
    index = memoryview(numpy.memmap(prefix + ".idx", mode="r", order="C"))
    sizes = numpy.frombuffer(index, dtype=numpy.int32, count=num_sequences, offset=offset)
    offset += sizes.nbytes
    pointers = numpy.frombuffer(index, dtype=numpy.int64, count=num_sequences, offset=offset)
    offset += pointers.nbytes
    doc_idx = numpy.frombuffer(index, dtype=numpy.int64, count=num_entries, offset=offset)
    dtype = DTYPES[code]
    data = memoryview(numpy.memmap(prefix + ".bin", mode="r", order="C")) if sizes.sum() > 0 else None
    sequences = []
    for size, pointer in zip(sizes, pointers):
        if size == 0:
            sequences.append([])
            continue
        tokens = numpy.frombuffer(data, dtype=dtype, count=int(size), offset=int(pointer))
        sequences.append([int(t) for t in tokens])
    json.dump({"dtype_code": code, "sizes": [int(s) for s in sizes], "pointers": [int(p) for p in pointers],
               "doc_idx": [int(d) for d in doc_idx], "sequences": sequences}, sys.stdout)


def write(prefix, vocab_size, corpus_path):
    with open(corpus_path) as stream:
        corpus = json.load(stream)
    # Megatron's DType.optimal_dtype.
    dtype = numpy.uint16 if vocab_size < 65500 else numpy.int32
    sizes, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as data:
        for document in corpus:
            for sequence in document:
                data.write(numpy.array(sequence, dtype=dtype).tobytes(order="C"))
                sizes.append(len(sequence))
            doc_idx.append(len(sizes))
    itemsize = numpy.dtype(dtype).itemsize
    pointers, position = [], 0
    for size in sizes:
        pointers.append(position)
        position += size * itemsize
    with open(prefix + ".idx", "wb") as index:
        index.write(MAGIC)
        index.write(struct.pack("<Q", 1))
        index.write(struct.pack("<B", code_of(dtype)))
        index.write(struct.pack("<Q", len(sizes)))
        index.write(struct.pack("<Q", len(doc_idx)))
        index.write(numpy.array(sizes, dtype=numpy.int32).tobytes(order="C"))
        index.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
        index.write(numpy.array(doc_idx, dtype=numpy.int64).tobytes(order="C"))


def split_bounds(splits, size):
    """Megatron's get_train_valid_test_split_, restated."""
    separator = "," if "," in splits else "/"
    weights = [float(w) for w in splits.split(separator)]
    weights = (weights + [0.0, 0.0, 0.0])[:3]
    total = sum(weights)
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight / total * float(size))))
    excess = bounds[-1] - size
    return [bounds[0]] + [b - excess for b in bounds[1:]]


def splits(cases_path):
    with open(cases_path) as stream:
        for line in stream:
            if line.strip():
                text, size = line.split()
                print(" ".join(str(b) for b in split_bounds(text, int(size))))


if __name__ == "__main__":
    if sys.argv[1] == "read":
        read(sys.argv[2])
    elif sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "splits":
        splits(sys.argv[2])
    else:
        sys.exit("unknown mode " + sys.argv[1])
