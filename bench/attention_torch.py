"""PyTorch's side of bench/attention_compare.sh: causal attention forward and
backward on the CPU, on the shapes of bench/attention_bench.cc, on --threads
threads (default 1; one process per thread count). Two PyTorch forms:
  sdpa   torch.nn.functional._scaled_dot_product_attention(is_causal=True)
         (PyTorch 1.13's private form of scaled_dot_product_attention)
  eager  q kᵀ · scale, a causal mask (masked_fill -inf), softmax, @ v
Backward: autograd of the output against a fixed upstream gradient (dq, dk,
dv). Prints one line per (case, threads): label, threads, then the median
milliseconds of forward and of backward for sdpa and for eager, tab-separated.

  /usr/bin/python3 bench/attention_torch.py [--quick] [--threads=N]
"""

import math
import os
import statistics
import sys
import time

THREADS = int(next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--threads=")), "1"))
# Debian's torch does its GEMMs in OpenBLAS (pthreads build), whose own
# threads torch.set_num_threads does not reach (its "1 thread" rows ran their
# matrix products on 2 cores): set before torch loads.
os.environ["OMP_NUM_THREADS"] = str(THREADS)
os.environ["OPENBLAS_NUM_THREADS"] = str(THREADS)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F

CASES = [
    ("gpt2_nano (16,4,32,16)", 16, 4, 32, 16),
    ("BERT-base seq 128 (8,12,128,64)", 8, 12, 128, 64),
    ("GPT-2 seq 1024 (1,12,1024,64)", 1, 12, 1024, 64),
]


def eager(q, k, v, scale):
    t, s = q.shape[-2], k.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * scale
    causal = torch.ones(t, s, dtype=torch.bool).triu(1 + s - t)
    return torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1) @ v


def sdpa(q, k, v, scale):
    del scale  # 1/sqrt(D), the function's own
    out = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)
    return out[0] if isinstance(out, tuple) else out


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(form, b, h, t, d, repeats):
    gen = torch.Generator().manual_seed(1)
    q, k, v, dy = (torch.rand(b, h, t, d, generator=gen) * 2 - 1 for _ in range(4))
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    scale = 1.0 / math.sqrt(d)
    holder = {}

    def forward():
        holder["y"] = form(q, k, v, scale)

    def backward():
        q.grad = k.grad = v.grad = None
        y = form(q, k, v, scale)
        start = time.perf_counter()
        y.backward(dy)
        holder["bwd"] = (time.perf_counter() - start) * 1e3

    with torch.no_grad():
        fwd = median_ms(forward, repeats)
    bwd_times = []
    backward()
    for _ in range(repeats):
        backward()
        bwd_times.append(holder["bwd"])
    return fwd, statistics.median(bwd_times)


def main():
    quick = "--quick" in sys.argv[1:]
    repeats = 3 if quick else 7
    torch.set_num_threads(THREADS)
    for label, b, h, t, d in CASES:
        s_fwd, s_bwd = measure(sdpa, b, h, t, d, repeats)
        e_fwd, e_bwd = measure(eager, b, h, t, d, repeats)
        print(f"{label}\t{THREADS}\t{s_fwd:.3f}\t{s_bwd:.3f}\t{e_fwd:.3f}\t{e_bwd:.3f}", flush=True)


if __name__ == "__main__":
    main()
