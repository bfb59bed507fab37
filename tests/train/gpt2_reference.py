#!/usr/bin/python3
"""GPT-2 in PyTorch from a Tessera checkpoint: the independent reference of
tests/train/generate_test.cc, and the PyTorch side of bench/generate_compare.sh.

Written from the model's definition, not from Tessera's code: Hugging Face
GPT-2's forward (pre-LayerNorm blocks, fused QKV, causal softmax(q kᵀ/√D) v,
tanh GELU, ln_f, LM head tied to wte), float32, no dropout, with the weights
read straight from the checkpoint's files (index.json + safetensors rank
files, shards assembled here; no `safetensors` package).

  gpt2_reference.py CHECKPOINT logits --ids 1,2,3 [--greedy N]
      prints one JSON object: "logits", the last position's logits after a
      from-scratch forward of the ids (no cache), and "greedy", N tokens of
      greedy continuation (argmax, lowest id on ties), each a from-scratch
      forward of the whole sequence, and "margins", each step's top-1 minus
      top-2 logit (below the two sides' rounding, the choice is a tie).
  gpt2_reference.py CHECKPOINT bench [--prompt-len 16] [--new-tokens 256]
                                     [--threads 1] [--repeats 5] [--step addmm]
      greedy generation with a preallocated KV cache (past_key_values style:
      the prompt in one forward, then one token per forward attending over
      the cache; --step addmm: the forward's layers as Hugging Face's GPT-2
      writes them, addmv: a step written for one token); prints "tokens/s X"
      (new tokens / time of the whole generation, the best of the repeats
      after one warm-up) and "ids ..." (the tokens, for comparing with
      bench/generate_bench's).

  gpt2_reference.py FILE make-hf --model JSON [--seed S] [--std 0.2]
      writes a random GPT-2 of the model config JSON (Tessera's model.* keys)
      to FILE in Hugging Face's layout, as GPT2LMHeadModel's save_pretrained
      does: "transformer."-prefixed GPT2Model names, Conv1D weights (in, out)
      with c_attn (C, 3C), lm_head.weight (the tied wte), the attention's
      causal-mask buffers (attn.bias, which hold no weights), metadata
      {"format": "pt"}. Weights ~N(0, std), LayerNorm gains ~1 ± 0.1, every
      bias nonzero: a mix-up of any two tensors changes the logits.

CHECKPOINT is a checkpoint directory (holding index.json), an output
directory (its latest checkpoints/iter_*), or a Hugging Face safetensors file
(read strictly in Hugging Face's layout: c_attn must be (C, 3C); the model's
hyper-parameters come from --model JSON). Run with OMP_WAIT_POLICY=PASSIVE
(set here before torch loads if unset).
"""

import argparse
import json
import math
import os
import struct
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _thread_count_from_argv():
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


# Debian's torch runs GEMMs in OpenBLAS (pthreads), whose thread count
# torch.set_num_threads does not reach: both set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", _thread_count_from_argv())
os.environ.setdefault("OPENBLAS_NUM_THREADS", _thread_count_from_argv())

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def checkpoint_dir(path):
    if os.path.exists(os.path.join(path, "index.json")):
        return path
    root = os.path.join(path, "checkpoints")
    names = sorted(n for n in os.listdir(root) if n.startswith("iter_") and
                   os.path.exists(os.path.join(root, n, "index.json")))
    if not names:
        raise SystemExit(f"gpt2_reference: no checkpoint in {path}")
    return os.path.join(root, names[-1])


def _read_safetensors_header(path):
    """(header dict, offset of the data): 8-byte little-endian header size,
    the JSON header, then the raw tensors."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return header, 8 + size


def read_index(path):
    """(the checkpoint directory, its index.json)."""
    directory = checkpoint_dir(path)
    with open(os.path.join(directory, "index.json")) as f:
        return directory, json.load(f)


def gpt2_tensor_names(model_config):
    """The parameters of a GPT-2 (Hugging Face's names, as Tessera's)."""
    names = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    for i in range(model_config["num_layers"]):
        for part in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            names += [f"h.{i}.{part}.weight", f"h.{i}.{part}.bias"]
    return names


def load_checkpoint(path):
    """(the GPT-2's tensors by name as float32 numpy arrays, the run's
    config); the optimizer's state is not read."""
    directory, index = read_index(path)
    if index["config"]["model"].get("_target_") != "models.GPT2":
        raise SystemExit("gpt2_reference: not a models.GPT2 checkpoint")
    headers = {}
    tensors = {}
    for name in gpt2_tensor_names(index["config"]["model"]):
        entry = index["tensors"][name]
        whole = np.zeros(entry["shape"], dtype=np.float32)
        for shard in entry["shards"]:
            file = os.path.join(directory, shard["file"])
            if file not in headers:
                headers[file] = _read_safetensors_header(file)
            header, base = headers[file]
            info = header[name]
            dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
            begin, end = info["data_offsets"]
            data = np.fromfile(file, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=base + begin)
            region = tuple(slice(o, o + n) for o, n in zip(shard["offset"], shard["shape"]))
            whole[region] = data.reshape(shard["shape"])
        tensors[name] = whole
    return tensors, index["config"]


def load_huggingface(path, model_config):
    """A Hugging Face GPT-2 file: (tensors by Tessera's names, a config with
    `model_config`). Checks Hugging Face's layout on the way."""
    header, base = _read_safetensors_header(path)
    if header.get("__metadata__", {}).get("format") != "pt":
        raise SystemExit(f"gpt2_reference: {path}: no __metadata__ format pt")
    C = model_config["hidden_size"]
    tensors = {}
    for name in gpt2_tensor_names(model_config):
        key = name if name in header else "transformer." + name
        if key not in header:
            raise SystemExit(f"gpt2_reference: {path}: no {name}")
        info = header[key]
        if name.endswith("attn.c_attn.weight") and info["shape"] != [C, 3 * C]:
            raise SystemExit(f"gpt2_reference: {path}: {name} is {info['shape']}, Hugging Face's is [C, 3C]")
        if name.endswith("attn.c_attn.bias") and info["shape"] != [3 * C]:
            raise SystemExit(f"gpt2_reference: {path}: {name} is {info['shape']}, Hugging Face's is [3C]")
        dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        data = np.fromfile(path, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=base + begin)
        tensors[name] = data.reshape(info["shape"]).astype(np.float32)
    return tensors, {"model": model_config}


def write_safetensors(path, tensors, metadata):
    """`tensors` (name -> float32 or int64 numpy array, in order) as safetensors."""
    names = {np.dtype("float32"): ("F32", "<f4"), np.dtype("int64"): ("I64", "<i8")}
    header = {"__metadata__": metadata}
    offset = 0
    for name, value in tensors.items():
        header[name] = {"dtype": names[value.dtype][0], "shape": list(value.shape),
                        "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for value in tensors.values():
            f.write(np.ascontiguousarray(value, dtype=names[value.dtype][1]).tobytes())


def make_huggingface(path, c, seed, weight_std=0.2):
    rng = np.random.default_rng(seed)
    V, C, P = c["vocab_size"], c["hidden_size"], c["max_seq_length"]
    Fw = c.get("ffn_hidden_size") or 4 * C

    def normal(*shape, mean=0.0, std=weight_std):
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    t = {"transformer.wte.weight": normal(V, C), "transformer.wpe.weight": normal(P, C)}
    for i in range(c["num_layers"]):
        p = f"transformer.h.{i}."
        t[p + "ln_1.weight"], t[p + "ln_1.bias"] = normal(C, mean=1.0, std=0.1), normal(C, std=0.1)
        t[p + "attn.bias"] = np.tril(np.ones((P, P), dtype=np.float32)).reshape(1, 1, P, P)
        t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"] = normal(C, 3 * C), normal(3 * C, std=0.1)
        t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"] = normal(C, C), normal(C, std=0.1)
        t[p + "ln_2.weight"], t[p + "ln_2.bias"] = normal(C, mean=1.0, std=0.1), normal(C, std=0.1)
        t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = normal(C, Fw), normal(Fw, std=0.1)
        t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = normal(Fw, C, std=0.1), normal(C, std=0.1)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = normal(C, mean=1.0, std=0.1), normal(C, std=0.1)
    t["lm_head.weight"] = t["transformer.wte.weight"]
    write_safetensors(path, t, {"format": "pt"})


class Gpt2:
    """GPT-2 forward over torch tensors, with an optional KV cache."""

    def __init__(self, tensors, model_config):
        c = model_config
        self.layers = c["num_layers"]
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.head_dim = self.hidden // self.heads
        self.positions = c["max_seq_length"]
        self.eps = c["layernorm_epsilon"]
        t = {name: torch.from_numpy(value) for name, value in tensors.items()}
        C = self.hidden
        self.wte, self.wpe = t["wte.weight"], t["wpe.weight"]  # (V, C), (P, C)
        self.ln_f = (t["ln_f.weight"], t["ln_f.bias"])
        self.blocks = []
        for i in range(self.layers):
            p = f"h.{i}."
            self.blocks.append({
                "ln_1": (t[p + "ln_1.weight"], t[p + "ln_1.bias"]),
                # Hugging Face's Conv1D layout: (C, 3C) = [q | k | v] column blocks.
                "c_attn": (t[p + "attn.c_attn.weight"].reshape(C, 3 * C), t[p + "attn.c_attn.bias"].reshape(3 * C)),
                "attn_proj": (t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"]),
                "ln_2": (t[p + "ln_2.weight"], t[p + "ln_2.bias"]),
                "c_fc": (t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"]),
                "mlp_proj": (t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"]),
            })

    def _layer_norm(self, x, params):
        return F.layer_norm(x, (self.hidden,), params[0], params[1], self.eps)

    def forward(self, ids, cache=None, start=0):
        """Logits (T, V) of `ids` (T,) at positions [start, start + T). With
        `cache` (a list of (K, V) tensors (H, P, D) per layer), the new keys
        and values are written at rows [start, start + T) and attention reads
        rows [0, start + T); without it, start must be 0."""
        T = ids.shape[0]
        H, D, C = self.heads, self.head_dim, self.hidden
        x = self.wte[ids] + self.wpe[start:start + T]  # (T, C)
        L = start + T
        # Query t (position start + t) sees keys s <= start + t; one query
        # (a decoding step) sees them all.
        allowed = torch.arange(L)[None, :] <= (start + torch.arange(T))[:, None] if T > 1 else None  # (T, L)
        for i, block in enumerate(self.blocks):
            a = self._layer_norm(x, block["ln_1"])
            qkv = torch.addmm(block["c_attn"][1], a, block["c_attn"][0])  # (T, 3C)
            q, k, v = (part.reshape(T, H, D).transpose(0, 1) for part in qkv.split(C, dim=1))  # (H, T, D)
            if cache is not None:
                k_cache, v_cache = cache[i]
                k_cache[:, start:L] = k
                v_cache[:, start:L] = v
                k, v = k_cache[:, :L], v_cache[:, :L]
            scores = torch.matmul(q, k.transpose(1, 2)) * (1.0 / math.sqrt(D))  # (H, T, L)
            if T > 1:
                scores = scores.masked_fill(~allowed, float("-inf"))
            context = torch.matmul(torch.softmax(scores, dim=-1), v)  # (H, T, D)
            context = context.transpose(0, 1).reshape(T, C)
            x = x + torch.addmm(block["attn_proj"][1], context, block["attn_proj"][0])
            m = self._layer_norm(x, block["ln_2"])
            hidden = F.gelu(torch.addmm(block["c_fc"][1], m, block["c_fc"][0]), approximate="tanh")
            x = x + torch.addmm(block["mlp_proj"][1], hidden, block["mlp_proj"][0])
        return torch.matmul(self._layer_norm(x, self.ln_f), self.wte.t())  # (T, V), HF's lm_head F.linear

    def new_cache(self):
        shape = (self.heads, self.positions, self.head_dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(self.layers)]

    def prepare_vector_step(self):
        """Contiguous (out, in) copies of the weights for vector_step."""
        self.transposed = [{name: block[name][0].t().contiguous()
                            for name in ("c_attn", "attn_proj", "c_fc", "mlp_proj")} for block in self.blocks]

    def vector_step(self, token, cache, position):
        """forward(tensor([token]), cache, position)[-1] written for one token:
        matrix-vector products (addmv, mv: on this torch far faster than
        addmm with one row) on (out, in) weights, one bmm per attention
        product over the cache. Needs prepare_vector_step()."""
        H, D, C = self.heads, self.head_dim, self.hidden
        x = self.wte[token] + self.wpe[position]  # (C)
        L = position + 1
        for i, block in enumerate(self.blocks):
            w = self.transposed[i]
            qkv = torch.addmv(block["c_attn"][1], w["c_attn"], self._layer_norm(x, block["ln_1"]))  # (3C)
            q, k, v = qkv.view(3, H, D)
            k_cache, v_cache = cache[i]
            k_cache[:, position] = k
            v_cache[:, position] = v
            scores = torch.bmm(k_cache[:, :L], q.unsqueeze(2)).squeeze(2) * (1.0 / math.sqrt(D))  # (H, L)
            context = torch.bmm(torch.softmax(scores, dim=-1).unsqueeze(1), v_cache[:, :L]).reshape(C)
            x = x + torch.addmv(block["attn_proj"][1], w["attn_proj"], context)
            hidden = F.gelu(torch.addmv(block["c_fc"][1], w["c_fc"], self._layer_norm(x, block["ln_2"])),
                            approximate="tanh")
            x = x + torch.addmv(block["mlp_proj"][1], w["mlp_proj"], hidden)
        return torch.mv(self.wte, self._layer_norm(x, self.ln_f))  # (V)

    def generate_greedy(self, prompt, new_tokens, step="addmm"):
        """Greedy continuation with the KV cache: the prompt in one forward,
        then one token per forward, `step` "addmm" (forward(), Hugging
        Face's GPT-2 layers: Conv1D is addmm, the head F.linear) or
        "addmv" (vector_step())."""
        cache = self.new_cache()
        ids = list(prompt)
        logits = self.forward(torch.tensor(ids), cache, 0)[-1]
        for index in range(new_tokens):
            token = int(torch.argmax(logits))
            ids.append(token)
            if index + 1 < new_tokens:
                if step == "addmv":
                    logits = self.vector_step(token, cache, len(ids) - 1)
                else:
                    logits = self.forward(torch.tensor([token]), cache, len(ids) - 1)[-1]
        return ids[len(prompt):]


def bench_prompt(length, vocab):
    """The prompt both sides of bench/generate_compare.sh use."""
    return [(i * 7919 + 1) % vocab for i in range(length)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("mode", choices=["logits", "bench", "make-hf"])
    parser.add_argument("--model", default="", help="the model config (JSON) of a Hugging Face file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float, default=0.2, help="make-hf: the weights' standard deviation")
    parser.add_argument("--ids", default="")
    parser.add_argument("--greedy", type=int, default=0)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step", choices=["addmm", "addmv"], default="addmm")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode == "make-hf":
        make_huggingface(args.checkpoint, json.loads(args.model), args.seed, args.std)
        return
    if os.path.isfile(args.checkpoint):
        tensors, config = load_huggingface(args.checkpoint, json.loads(args.model))
    else:
        tensors, config = load_checkpoint(args.checkpoint)
    model = Gpt2(tensors, config["model"])
    with torch.inference_mode():
        if args.mode == "logits":
            ids = [int(v) for v in args.ids.split(",") if v]
            logits = model.forward(torch.tensor(ids))[-1]
            greedy, margins = [], []
            sequence = list(ids)
            for _ in range(args.greedy):
                step_logits = model.forward(torch.tensor(sequence))[-1]
                token = int(torch.argmax(step_logits))
                top2 = torch.topk(step_logits, 2).values
                greedy.append(token)
                margins.append(float(top2[0] - top2[1]))
                sequence.append(token)
            json.dump({"logits": [float(v) for v in logits], "greedy": greedy, "margins": margins}, sys.stdout)
            print()
            return
        prompt = bench_prompt(args.prompt_len, model.wte.shape[0])
        if args.step == "addmv":
            model.prepare_vector_step()
        model.generate_greedy(prompt, 8, args.step)  # warm-up
        best = None
        for _ in range(args.repeats):
            begin = time.perf_counter()
            new = model.generate_greedy(prompt, args.new_tokens, args.step)
            seconds = time.perf_counter() - begin
            best = seconds if best is None else min(best, seconds)
        print(f"tokens/s {args.new_tokens / best:.1f}")
        print("ids " + ",".join(map(str, new)))


if __name__ == "__main__":
    main()
