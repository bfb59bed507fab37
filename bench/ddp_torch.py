#!/usr/bin/python3
"""GPT-2 trained data-parallel over 2 processes with PyTorch DDP (gloo): the
reference side of bench/ddp_compare.sh (Tessera's is bench/ddp_bench.cc).

The same model, shapes and training step as ddp_bench: DESIGN §13's CPU model
(4 layers, hidden 256, 4 heads, seq 128, micro-batch 8 per rank, vocabulary
8192, Hugging Face GPT-2's layout: pre-LayerNorm blocks, fused QKV with bias,
tanh GELU, LM head tied to wte, dropout 0, GPT-2 init), AdamW as gpt2_nano's
config (lr 3e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 except
LayerNorm weights and biases), gradients clipped to norm 1.0 (configs/common/
optim.json), a warm-up-cosine learning rate. Random token data.

Each process runs one kernel thread (--threads N: N); rank 0 times
every step (loss.item() after optimizer.step()), and the time per iteration
is (t[last] - t[warmup - 1]) / iters, as in ddp_bench.

  /usr/bin/python3 bench/ddp_torch.py [--world 2] [--warmup 5] [--iters 20]
                                      [--allreduce-mb 0]

--world 1: one process, no DDP (compute alone). --allreduce-mb N: after the
training, also times torch.distributed.all_reduce of N MB of f32 (gloo).
--shape L,H,NH,T,B,V replaces (layers, hidden, heads, seq, micro-batch,
vocabulary): 12,768,12,1024,4,50257 is GPT-2 124M (bench/memory_compare.sh).
Rank 0 also prints its peak resident set (peak_rss_mib).
Run with OMP_WAIT_POLICY=PASSIVE (set here before torch loads if unset).
"""

import argparse
import math
import os
import socket
import statistics
import sys
import time

def _threads_from_argv():
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


THREADS = int(_threads_from_argv())
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
# Debian's torch does its GEMMs in OpenBLAS (pthreads build), whose own thread
# count torch.set_num_threads does not reach: set before torch loads (one
# thread per process unless --threads says otherwise).
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))

import torch  # noqa: E402  (after the OpenMP environment)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, MICRO_BATCH, VOCAB = 4, 256, 4, 128, 8, 8192


def _shape_from_argv():
    for i, arg in enumerate(sys.argv):
        value = sys.argv[i + 1] if arg == "--shape" and i + 1 < len(sys.argv) else (
            arg.split("=", 1)[1] if arg.startswith("--shape=") else None)
        if value is not None:
            return tuple(int(x) for x in value.split(","))
    return None


if _shape_from_argv() is not None:
    LAYERS, HIDDEN, HEADS, SEQ, MICRO_BATCH, VOCAB = _shape_from_argv()
FFN = 4 * HIDDEN
INIT_STD = 0.02
LR, WEIGHT_DECAY, BETAS, EPS, CLIP = 3e-3, 0.01, (0.9, 0.999), 1e-8, 1.0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(HIDDEN, eps=1e-5)
        self.c_attn = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.attn_proj = nn.Linear(HIDDEN, HIDDEN)
        self.ln_2 = nn.LayerNorm(HIDDEN, eps=1e-5)
        self.c_fc = nn.Linear(HIDDEN, FFN)
        self.mlp_proj = nn.Linear(FFN, HIDDEN)
        # A plain attribute, not a buffer: DDP's gloo broadcast of buffers refuses bool.
        self.causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()

    def forward(self, x):  # x: (B, T, C)
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, HS)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // HEADS))  # (B, NH, T, T)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, HIDDEN)
        self.wpe = nn.Embedding(SEQ, HIDDEN)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HIDDEN, eps=1e-5)
        output_std = INIT_STD / math.sqrt(2 * LAYERS)  # use_scaled_init_for_output_weights
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=output_std if name.endswith("proj.weight") else INIT_STD)

    def forward(self, tokens, labels):  # (B, T) i64 each -> mean loss
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head: (B, T, V)
        return F.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1))


def thread_times():
    """{tid: (seconds on a CPU, seconds runnable waiting for one)} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns = f.read().split()[:2]
            out[int(tid)] = (int(run_ns) * 1e-9, int(wait_ns) * 1e-9)
        except OSError:
            pass  # the thread has just exited
    return out


def warmup_cosine(total, warmup_ratio=0.05, warmup_factor=0.001, alpha=0.01):
    # LiBai's WarmupCosineLR, as Tessera's: the cosine counts from iteration
    # 0, the linear warmup ramps to its value at the warmup's end.
    warmup = math.ceil(total * warmup_ratio)

    def decayed(it):
        return alpha + (1 - alpha) * 0.5 * (1 + math.cos(math.pi * min(it, total) / total))

    def factor(it):
        if it < warmup:
            return warmup_factor + (decayed(warmup) - warmup_factor) * it / warmup
        return decayed(it)

    return factor


def run(rank, world, port, args):
    torch.set_num_threads(THREADS)
    torch.set_num_interop_threads(1)
    torch.manual_seed(1234)  # the same init on every rank, as DDP's broadcast would give
    model = Gpt2()
    params = sum(p.numel() for p in model.parameters())
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    # As Tessera's no_decay_norm_and_bias: LayerNorm weights and all biases get no weight decay.
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            (no_decay if isinstance(module, nn.LayerNorm) or name == "bias" else decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    total = args.warmup + args.iters
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total))
    generator = torch.Generator().manual_seed(1000 + rank)
    stamps, cpu_stamps, losses = [], [], []
    for it in range(total):
        data = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=generator)
        loss = model(data[:, :-1], data[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        stamps.append(time.perf_counter())
        cpu_stamps.append(time.process_time())  # every thread of the process
        if it == args.warmup - 1:
            threads_first = thread_times()
    threads_last = thread_times()
    if rank == 0:
        steps = sorted(1e3 * (stamps[i] - stamps[i - 1]) for i in range(args.warmup, total))
        per_iteration = (stamps[-1] - stamps[args.warmup - 1]) / args.iters
        print(f"torch {torch.__version__} gpt2 layers={LAYERS} hidden={HIDDEN} heads={HEADS} seq={SEQ} "
              f"vocab={VOCAB} micro_batch={MICRO_BATCH} world={world} threads={torch.get_num_threads()}")
        print(f"parameters {params}")
        print(f"  decay {sum(p.numel() for p in decay)}, no decay {sum(p.numel() for p in no_decay)}")
        print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f}; ms per iteration: mean {per_iteration * 1e3:.2f}, "
              f"min {steps[0]:.2f}, median {statistics.median(steps):.2f}, max {steps[-1]:.2f}")
        print(f"cpu_ms_per_iteration {1e3 * (cpu_stamps[-1] - cpu_stamps[args.warmup - 1]) / args.iters:.2f}")
        # Each thread's iteration: on a CPU, waiting for one, and blocked.
        rows = []
        for tid, (run, wait) in threads_last.items():
            if tid in threads_first:
                run, wait = ((x - y) / args.iters for x, y in zip((run, wait), threads_first[tid]))
                rows.append((run, wait, tid))
        for run, wait, tid in sorted(rows, reverse=True):
            if run >= 1e-3 * per_iteration:
                print(f"    thread {tid} per iteration: on a CPU {run * 1e3:.1f} ms, runnable waiting for one "
                      f"{wait * 1e3:.1f} ms, blocked {(per_iteration - run - wait) * 1e3:.1f} ms")
        print(f"tokens/s {world * MICRO_BATCH * SEQ / per_iteration:.1f}")
        import resource
        print(f"peak_rss_mib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}")
    if world > 1 and args.allreduce_mb > 0:
        buffer = torch.ones(args.allreduce_mb * (1 << 20) // 4)
        times = []
        for rep in range(args.allreduce_reps + 1):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if rep > 0:
                times.append(time.perf_counter() - start)
        if rank == 0:
            median = statistics.median(times)
            print(f"torch.distributed all_reduce f32 {args.allreduce_mb} MB (gloo), median of {args.allreduce_reps}: "
                  f"{buffer.numel() * 4 / median / 1e9:.3f} GB/s ({median * 1e3:.1f} ms)")
    if world > 1:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="processes (1: no DDP)")
    parser.add_argument("--threads", type=int, default=1, help="kernel threads per process (read before torch loads)")
    parser.add_argument("--warmup", type=int, default=5, help="iterations excluded from the timing")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations")
    parser.add_argument("--allreduce-mb", type=int, default=0, help="also time an all-reduce of this many MB")
    parser.add_argument("--allreduce-reps", type=int, default=7)
    parser.add_argument("--shape", help="L,H,NH,T,B,V: layers, hidden, heads, seq, micro-batch, vocabulary "
                        "(read before the model is defined)")
    args = parser.parse_args()
    if args.world < 1 or args.warmup < 1 or args.iters < 1:
        parser.error("--world, --warmup and --iters must be >= 1")
    if args.world == 1:
        run(0, 1, 0, args)
    else:
        mp.spawn(run, args=(args.world, free_port(), args), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
