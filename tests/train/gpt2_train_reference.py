#!/usr/bin/python3
"""GPT-2 training in PyTorch: the independent reference of
tests/train/torch_training_test.cc, which compares Tessera's metrics.jsonl
with it iteration by iteration.

Written from the definitions, not from Tessera's code: the model is
gpt2_reference.py's forward rewritten with autograd (Hugging Face GPT-2's
math: pre-LayerNorm blocks, fused QKV, causal softmax(q kᵀ/√D) v, tanh GELU,
ln_f, the head tied to wte), float32, no dropout; the optimizers are
torch.optim.AdamW and torch.optim.SGD with biases and LayerNorm weights in a
group without weight decay; clipping is torch.nn.utils.clip_grad_norm_; the
learning-rate schedules are LiBai's (OneFlow's CosineDecayLR, MultiStepLR,
after a linear warmup of ceil(warmup_ratio × train_iter) iterations from
warmup_factor × lr to the schedule's value at its end).

  gpt2_train_reference.py WEIGHTS --model JSON --tokens TOKENS.json [options]

WEIGHTS is a Hugging Face GPT-2 safetensors file (gpt2_reference.py make-hf);
TOKENS.json one list of token ids, the whole training stream: sample s is
tokens[s*T : s*T + T + 1] (data/gpt_dataset.h). Each iteration trains on
--global-batch samples, positions it*G .. it*G+G-1 modulo the sample count
(with as many samples as the global batch, as the test arranges, the order
in which a run reads them does not matter). Prints one JSON line per
iteration: iter (from 1), loss (the mean over the global batch's tokens,
before the update), lr (the update's), grad_norm (the global norm before
clipping).
"""
import argparse
import json
import math
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("weights")
    parser.add_argument("--model", required=True, help="the model.* keys as JSON")
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--train-iter", type=int, default=0, help="the schedule's length (default --iters)")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--micro", type=int, default=0, help="accumulate over micro-batches of this size")
    parser.add_argument("--optim", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--betas", default="0.9,0.999")
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--nesterov", action="store_true")
    parser.add_argument("--clip", type=float, default=0.0, help="max norm; 0: no clipping")
    parser.add_argument("--norm-type", default="2")
    parser.add_argument("--schedule", choices=["constant", "cosine", "multistep"], default="constant")
    parser.add_argument("--warmup-ratio", type=float, default=0.0)
    parser.add_argument("--warmup-factor", type=float, default=0.001)
    parser.add_argument("--alpha", type=float, default=0.01, help="cosine: the final fraction of lr")
    parser.add_argument("--milestones", default="")
    parser.add_argument("--gamma", type=float, default=0.1)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    config = json.loads(args.model)
    tensors, _ = gpt2_reference.load_huggingface(args.weights, config)
    params = {name: torch.nn.Parameter(torch.from_numpy(value).float()) for name, value in tensors.items()}
    L, C, H = config["num_layers"], config["hidden_size"], config["num_attention_heads"]
    D = C // H
    eps_ln = config.get("layernorm_epsilon", 1e-5)
    T = config.get("seq_length") or config["max_seq_length"]
    with open(args.tokens) as f:
        stream = json.load(f)
    count = (len(stream) - 1) // T
    samples = torch.tensor([stream[s * T:s * T + T + 1] for s in range(count)], dtype=torch.long)
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def loss_of(batch):
        ids, labels = batch[:, :-1], batch[:, 1:]
        B = ids.shape[0]
        P = params
        x = P["wte.weight"][ids] + P["wpe.weight"][:T]
        for i in range(L):
            q_ = f"h.{i}."
            h = F.layer_norm(x, (C,), P[q_ + "ln_1.weight"], P[q_ + "ln_1.bias"], eps_ln)
            qkv = h @ P[q_ + "attn.c_attn.weight"] + P[q_ + "attn.c_attn.bias"]
            q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            scores = scores.masked_fill(~causal, float("-inf"))
            context = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, T, C)
            x = x + context @ P[q_ + "attn.c_proj.weight"] + P[q_ + "attn.c_proj.bias"]
            h = F.layer_norm(x, (C,), P[q_ + "ln_2.weight"], P[q_ + "ln_2.bias"], eps_ln)
            h = F.gelu(h @ P[q_ + "mlp.c_fc.weight"] + P[q_ + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ P[q_ + "mlp.c_proj.weight"] + P[q_ + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps_ln)
        logits = x @ P["wte.weight"].t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def no_decay(name):
        return name.endswith(".bias") or name.split(".")[-2].startswith("ln_")

    groups = [
        {"params": [p for n, p in params.items() if not no_decay(n)], "weight_decay": args.weight_decay},
        {"params": [p for n, p in params.items() if no_decay(n)], "weight_decay": 0.0},
    ]
    if args.optim == "adamw":
        beta1, beta2 = (float(v) for v in args.betas.split(","))
        optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(beta1, beta2), eps=args.eps)
    else:
        optimizer = torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov)

    train_iter = args.train_iter or args.iters
    warmup = math.ceil(args.warmup_ratio * train_iter) if args.warmup_ratio > 0 else 0

    def factor(i):  # the schedule after warmup, at iteration i (from 0)
        if args.schedule == "cosine":
            if i >= train_iter:
                return args.alpha
            return (1 - args.alpha) * 0.5 * (1 + math.cos(math.pi * i / train_iter)) + args.alpha
        if args.schedule == "multistep":
            milestones = [int(v) for v in args.milestones.split(",") if v]
            return args.gamma ** sum(1 for m in milestones if i >= m)
        return 1.0

    def lr_at(i):
        if i < warmup:
            return args.lr * (args.warmup_factor + (factor(warmup) - args.warmup_factor) * i / warmup)
        return args.lr * factor(i)

    everything = list(params.values())
    norm_type = float(args.norm_type)
    G = args.global_batch
    for it in range(args.iters):
        batch = samples[[(it * G + r) % count for r in range(G)]]
        optimizer.zero_grad(set_to_none=True)
        micro = args.micro or G
        loss = 0.0
        for k in range(G // micro):
            part = loss_of(batch[k * micro:(k + 1) * micro]) / (G // micro)
            part.backward()
            loss += float(part)
        # (An unreachable max norm measures the norm without clipping.)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(everything, args.clip if args.clip > 0 else 1e30,
                                                         norm_type=norm_type))
        lr = lr_at(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        print(json.dumps({"iter": it + 1, "loss": loss, "lr": lr, "grad_norm": grad_norm}), flush=True)


if __name__ == "__main__":
    main()
