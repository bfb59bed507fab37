#!/usr/bin/env python3
"""PyTorch references for scripts/gpu_check.sh, on the same machine as
Tessera's GPU runs (issue 13's benchmarks).

  torch_bench.py gpt2 [--compile] [--layers 12 --hidden 768 --heads 12
                  --seq 1024 --vocab 50257 --batch 8 --steps 10 --warmup 3]
      GPT-2 (pre-norm blocks, causal attention through
      scaled_dot_product_attention, tanh GELU, tied head, dropout 0.1 as
      configs/gpt2_nano.json) trained with AdamW under bf16 autocast (f32
      master weights, as Tessera's train.amp), on random tokens: prints
      "torch gpt2 eager|compile: tokens/s N".
  torch_bench.py sdpa
      scaled_dot_product_attention forward + backward, causal, at
      bench/attention_bench.cc's GPU shapes, in f32 and bf16: median ms.

The model is written here, from the GPT-2 paper's description; nothing is
imported from other projects. Timed with CUDA events after a warm-up.
"""

import argparse
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)
        self.dropout = dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (y.view(shape).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, c)
        x = x + F.dropout(self.proj(a), self.dropout, self.training)
        h = F.gelu(self.fc(self.ln2(x)), approximate="tanh")
        return x + F.dropout(self.out(h), self.dropout, self.training)


class Gpt2(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.dropout = dropout
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, labels):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = F.dropout(self.wte(ids) + self.wpe(positions), self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def gpt2(args):
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    model = Gpt2(args.layers, args.hidden, args.heads, args.seq, args.vocab).to(device)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    except (TypeError, RuntimeError):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    def step(ids, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = torch.compile(step) if args.compile else step
    for _ in range(args.warmup):
        run(ids, labels)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        loss = run(ids, labels)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    params = sum(p.numel() for p in model.parameters())
    mode = "compile" if args.compile else "eager"
    print(f"torch gpt2 {mode}: tokens/s {args.batch * args.seq * args.steps / seconds:.0f} "
          f"({params} parameters, loss {loss.item():.4f}, torch {torch.__version__})")


def sdpa(_args):
    device = torch.device("cuda")
    shapes = [("gpt2_nano (16,4,32,16)", 16, 4, 32, 16), ("BERT-base seq 128 (8,12,128,64)", 8, 12, 128, 64),
              ("GPT-2 seq 1024 (1,12,1024,64)", 1, 12, 1024, 64), ("GPT-2 124M (8,12,1024,64)", 8, 12, 1024, 64)]
    print("torch scaled_dot_product_attention, causal, forward + backward, median ms of 20")
    for name, b, h, t, d in shapes:
        row = [name]
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            dy = torch.randn(b, h, t, d, device=device, dtype=dtype)
            times = []
            for i in range(25):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d))
                y.backward(dy)
                end.record()
                torch.cuda.synchronize()
                if i >= 5:
                    times.append(start.elapsed_time(end))
            row.append(f"{str(dtype).split('.')[-1]} {statistics.median(times):.3f} ms")
        print("  " + ", ".join(row))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["gpt2", "sdpa"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_bench: this PyTorch sees no GPU")
    {"gpt2": gpt2, "sdpa": sdpa}[args.what](args)


if __name__ == "__main__":
    main()
