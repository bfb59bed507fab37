#!/usr/bin/python3
"""BERT pre-training loss in PyTorch from a Tessera checkpoint: the independent
reference of Tessera's models.BERT.

Written from the model's definition, not from Tessera's code: post-LayerNorm
BERT as in Devlin et al. and Hugging Face's BertForPreTraining (embeddings
word + position + token type then LayerNorm; per layer bidirectional
softmax(q kᵀ/√D) v over the unpadded keys, residual + LayerNorm, erf GELU
MLP, residual + LayerNorm; the masked-LM head dense, erf GELU, LayerNorm,
decoder tied to the word embeddings plus a bias; the NSP head tanh pooler of
[CLS] then a 2-way classifier), float32, no dropout, with the weights read
straight from the checkpoint's files (index.json + safetensors rank files,
shards assembled here; no `safetensors` package). Weights are (in, out):
y = x @ W + b; c_attn is (C, 3, C) = [q | k | v].

  bert_reference.py CHECKPOINT BATCH.safetensors [--model JSON]
      prints one JSON object: "loss" (mlm_loss + nsp_loss), "mlm_loss"
      (Σ w·ce / Σ w over the masked-LM slots), "nsp_loss" (the mean over the
      batch; only with the model's binary head), "mlm_correct" (Σ w over the
      slots whose label's logit is the row's maximum, ties counting as
      correct), "mlm_count" (Σ w), "nsp_correct", "nsp_count" (B).

CHECKPOINT is a checkpoint directory (holding index.json), an output
directory (its latest checkpoints/iter_*), or Hugging Face BertForPreTraining
weights (a .safetensors file: "bert."-prefixed names or none, torch Linear
weights (out, in), query / key / value apart, LayerNorm weight / bias or
gamma / beta; --model gives the model config, which the file lacks).

  bert_reference.py OUT.safetensors make-hf --model JSON [--seed S] [--legacy]
      writes random Hugging Face BertForPreTraining weights of that config
      (the MLM decoder tied: a copy of the word embedding and of
      cls.predictions.bias); --legacy: old files' names, no "bert." prefix,
      LayerNorm gamma / beta, and an int64 embeddings.position_ids buffer.
 BATCH.safetensors holds one batch's
graph inputs: input_ids, token_type_ids, attention_mask I64 (B, T);
masked_lm_positions F32 (B, P, T) one-hot rows (all zero in an unused slot);
masked_lm_labels I64 (B, P); masked_lm_weights F32 (B, P);
next_sentence_labels I64 (B) with the binary head. Runs on one thread with
OMP_WAIT_POLICY=PASSIVE (set here before torch loads if unset).
"""

import argparse
import json
import math
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpt2_reference import _SAFETENSORS_DTYPES, _read_safetensors_header, write_safetensors  # noqa: E402

BATCH_INPUTS = {"input_ids": ("I64", 2), "token_type_ids": ("I64", 2), "attention_mask": ("I64", 2),
                "masked_lm_positions": ("F32", 3), "masked_lm_labels": ("I64", 2),
                "masked_lm_weights": ("F32", 2), "next_sentence_labels": ("I64", 1)}


def fail(message):
    raise SystemExit(f"bert_reference: {message}")


def checkpoint_dir(path):
    if os.path.isfile(os.path.join(path, "index.json")):
        return path
    root = os.path.join(path, "checkpoints")
    if not os.path.isdir(root):
        fail(f"no checkpoint in {path}")
    names = sorted(n for n in os.listdir(root) if n.startswith("iter_") and
                   os.path.isfile(os.path.join(root, n, "index.json")))
    if not names:
        fail(f"no checkpoint in {path}")
    return os.path.join(root, names[-1])


def bert_tensor_names(c):
    """The parameters of a BERT (the checkpoint's names); no optimizer state."""
    names = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
             "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias",
             "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
             "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
             "cls.predictions.bias"]
    for i in range(c["num_layers"]):
        for part in ("attn.c_attn", "attn.c_proj", "ln_1", "mlp.c_fc", "mlp.c_proj", "ln_2"):
            names += [f"encoder.layer.{i}.{part}.weight", f"encoder.layer.{i}.{part}.bias"]
    if c.get("add_binary_head"):
        names += ["pooler.dense.weight", "pooler.dense.bias",
                  "cls.seq_relationship.weight", "cls.seq_relationship.bias"]
    return names


def read_tensor(file, header, base, name):
    info = header.get(name)
    if info is None:
        fail(f"{file}: no {name}")
    if info["dtype"] not in _SAFETENSORS_DTYPES:
        fail(f"{file}: {name} has dtype {info['dtype']}")
    dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<")
    begin, end = info["data_offsets"]
    data = np.fromfile(file, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=base + begin)
    return info["dtype"], data.reshape(info["shape"])


def load_checkpoint(path):
    """(the BERT's tensors by name as float32 torch tensors, the model config)."""
    directory = checkpoint_dir(path)
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    model_config = index["config"]["model"]
    if model_config.get("_target_") != "models.BERT":
        fail(f"{directory}: not a models.BERT checkpoint")
    headers, tensors = {}, {}
    for name in bert_tensor_names(model_config):
        entry = index["tensors"].get(name)
        if entry is None:
            fail(f"{directory}: index.json has no {name}")
        whole = np.zeros(entry["shape"], dtype=np.float32)
        for shard in entry["shards"]:
            file = os.path.join(directory, shard["file"])
            if file not in headers:
                headers[file] = _read_safetensors_header(file)
            _, data = read_tensor(file, *headers[file], name)
            region = tuple(slice(o, o + n) for o, n in zip(shard["offset"], shard["shape"]))
            whole[region] = data.reshape(shard["shape"])
        tensors[name] = torch.from_numpy(whole)
    return tensors, model_config


def hf_linears(c):
    """(Tessera's Linear prefix, Hugging Face's) of a BERT config."""
    pairs = []
    for i in range(c["num_layers"]):
        t, h = f"encoder.layer.{i}.", f"bert.encoder.layer.{i}."
        pairs += [(t + "attn.c_proj", h + "attention.output.dense"), (t + "mlp.c_fc", h + "intermediate.dense"),
                  (t + "mlp.c_proj", h + "output.dense")]
    pairs.append(("cls.predictions.transform.dense", "cls.predictions.transform.dense"))
    if c.get("add_binary_head"):
        pairs += [("pooler.dense", "bert.pooler.dense"), ("cls.seq_relationship", "cls.seq_relationship")]
    return pairs


def hf_layer_norms(c):
    pairs = [("embeddings.LayerNorm", "bert.embeddings.LayerNorm"),
             ("cls.predictions.transform.LayerNorm", "cls.predictions.transform.LayerNorm")]
    for i in range(c["num_layers"]):
        t, h = f"encoder.layer.{i}.", f"bert.encoder.layer.{i}."
        pairs += [(t + "ln_1", h + "attention.output.LayerNorm"), (t + "ln_2", h + "output.LayerNorm")]
    return pairs


def load_huggingface(path, c):
    """BertForPreTraining weights as the reference's tensors (see the docstring)."""
    header, base = _read_safetensors_header(path)
    names = {n for n in header if n != "__metadata__"}

    def get(name):
        for candidate in (name, name[len("bert."):] if name.startswith("bert.") else name):
            for spelled in (candidate, candidate.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                    "LayerNorm.bias", "LayerNorm.beta")):
                if spelled in names:
                    _, data = read_tensor(path, header, base, spelled)
                    return torch.from_numpy(data.astype(np.float32))
        fail(f"{path}: no {name}")

    t = {}
    for name in ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                 "embeddings.token_type_embeddings.weight"):
        t[name] = get("bert." + name)
    t["cls.predictions.bias"] = get("cls.predictions.bias")
    for ours, theirs in hf_linears(c):
        t[ours + ".weight"] = get(theirs + ".weight").t().contiguous()  # (out, in) -> (in, out)
        t[ours + ".bias"] = get(theirs + ".bias")
    for ours, theirs in hf_layer_norms(c):
        t[ours + ".weight"], t[ours + ".bias"] = get(theirs + ".weight"), get(theirs + ".bias")
    for i in range(c["num_layers"]):
        h = f"bert.encoder.layer.{i}.attention.self."
        t[f"encoder.layer.{i}.attn.c_attn.weight"] = torch.stack(
            [get(h + part + ".weight").t() for part in ("query", "key", "value")], dim=1)  # (C, 3, C)
        t[f"encoder.layer.{i}.attn.c_attn.bias"] = torch.stack(
            [get(h + part + ".bias") for part in ("query", "key", "value")])  # (3, C)
    return t


def make_huggingface(path, c, seed, legacy):
    """Random BertForPreTraining weights of config `c` (see the docstring)."""
    rng = np.random.default_rng(seed)
    V, C, P, types = c["vocab_size"], c["hidden_size"], c["max_seq_length"], c.get("num_tokentypes", 2)
    Fw = c.get("ffn_hidden_size") or 4 * C

    def normal(*shape, mean=0.0, std=0.3):
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    def layer_norm(prefix):
        suffixes = ("gamma", "beta") if legacy else ("weight", "bias")
        t[f"{prefix}.{suffixes[0]}"], t[f"{prefix}.{suffixes[1]}"] = normal(C, mean=1.0, std=0.1), normal(C, std=0.1)

    def linear(prefix, n_in, n_out):
        t[prefix + ".weight"], t[prefix + ".bias"] = normal(n_out, n_in), normal(n_out, std=0.1)

    t = {"bert.embeddings.word_embeddings.weight": normal(V, C),
         "bert.embeddings.position_embeddings.weight": normal(P, C),
         "bert.embeddings.token_type_embeddings.weight": normal(types, C)}
    layer_norm("bert.embeddings.LayerNorm")
    for i in range(c["num_layers"]):
        h = f"bert.encoder.layer.{i}."
        for part in ("query", "key", "value"):
            linear(h + "attention.self." + part, C, C)
        linear(h + "attention.output.dense", C, C)
        layer_norm(h + "attention.output.LayerNorm")
        linear(h + "intermediate.dense", C, Fw)
        linear(h + "output.dense", Fw, C)
        layer_norm(h + "output.LayerNorm")
    linear("bert.pooler.dense", C, C)
    linear("cls.predictions.transform.dense", C, C)
    layer_norm("cls.predictions.transform.LayerNorm")
    t["cls.predictions.bias"] = normal(V, std=0.1)
    t["cls.predictions.decoder.weight"] = t["bert.embeddings.word_embeddings.weight"].copy()
    t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"].copy()
    linear("cls.seq_relationship", C, 2)
    if legacy:
        t = {"embeddings.position_ids": np.arange(P, dtype=np.int64).reshape(1, P),
             **{(n[len("bert."):] if n.startswith("bert.") else n): v for n, v in t.items()}}
    write_safetensors(path, t, {"format": "pt"})


def load_batch(path, binary_head):
    """The batch's inputs by name as torch tensors (int64 / float32)."""
    if not os.path.isfile(path):
        fail(f"no batch file {path}")
    header, base = _read_safetensors_header(path)
    batch = {}
    for name, (dtype, rank) in BATCH_INPUTS.items():
        if name == "next_sentence_labels" and not binary_head:
            continue
        got, data = read_tensor(path, header, base, name)
        if got != dtype or data.ndim != rank:
            fail(f"{path}: {name} is {got} {list(data.shape)}, expected {dtype} of rank {rank}")
        batch[name] = torch.from_numpy(data.astype(np.int64 if dtype == "I64" else np.float32))
    B, T = batch["input_ids"].shape
    P = batch["masked_lm_labels"].shape[1]
    expected = {"token_type_ids": (B, T), "attention_mask": (B, T), "masked_lm_positions": (B, P, T),
                "masked_lm_weights": (B, P), "next_sentence_labels": (B,)}
    for name, shape in expected.items():
        if name in batch and tuple(batch[name].shape) != shape:
            fail(f"{path}: {name} is {list(batch[name].shape)}, expected {list(shape)}")
    return batch


def check_ranges(batch, c):
    """Ids and labels inside the model's tables (else torch's own error)."""
    limits = {"input_ids": c["vocab_size"], "token_type_ids": c["num_tokentypes"],
              "masked_lm_labels": c["vocab_size"], "next_sentence_labels": 2}
    for name, limit in limits.items():
        if name in batch and batch[name].numel() and not 0 <= int(batch[name].min()) <= int(batch[name].max()) < limit:
            fail(f"{name} outside [0, {limit})")
    if batch["input_ids"].shape[1] > c["max_seq_length"]:
        fail(f"{batch['input_ids'].shape[1]} tokens, max_seq_length is {c['max_seq_length']}")


def bert_forward(t, c, batch):
    """The pre-training losses and counts of `batch` (see the docstring)."""
    C, H, eps = c["hidden_size"], c["num_attention_heads"], c["layernorm_epsilon"]
    D = C // H
    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    B, T = ids.shape

    def layer_norm(x, prefix):
        return F.layer_norm(x, (C,), t[prefix + ".weight"], t[prefix + ".bias"], eps)

    def dense(x, prefix):
        return x @ t[prefix + ".weight"] + t[prefix + ".bias"]

    h = layer_norm(t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:T]
                   + t["embeddings.token_type_embeddings.weight"][types], "embeddings.LayerNorm")
    padding = (mask == 0).reshape(B, 1, 1, T)  # keys that are padding
    for i in range(c["num_layers"]):
        p = f"encoder.layer.{i}."
        w, b = t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"]  # (C, 3, C), (3, C)
        q, k, v = ((h @ w[:, j, :] + b[j]).reshape(B, T, H, D).transpose(1, 2) for j in range(3))  # (B, H, T, D)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)  # (B, H, T, T)
        probs = torch.softmax(scores.masked_fill(padding, float("-inf")), dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(B, T, C)
        h1 = layer_norm(h + dense(context, p + "attn.c_proj"), p + "ln_1")
        m = dense(F.gelu(dense(h1, p + "mlp.c_fc")), p + "mlp.c_proj")
        h = layer_norm(h1 + m, p + "ln_2")

    positions = batch["masked_lm_positions"]  # (B, P, T)
    P = positions.shape[1]
    g = (positions @ h).reshape(B * P, C)
    g = layer_norm(F.gelu(dense(g, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
    logits = g @ t["embeddings.word_embeddings.weight"].t() + t["cls.predictions.bias"]  # (B·P, V)
    labels = batch["masked_lm_labels"].reshape(B * P)
    weights = batch["masked_lm_weights"].reshape(B * P)
    count = weights.sum()
    if float(count) <= 0:
        fail("the batch has no masked-LM slot of nonzero weight")
    mlm_loss = (weights * F.cross_entropy(logits, labels, reduction="none")).sum() / count
    correct = (logits.gather(1, labels[:, None])[:, 0] >= logits.max(dim=1).values).float()
    out = {"loss": float(mlm_loss), "mlm_loss": float(mlm_loss)}
    nsp_correct = nsp_count = 0.0
    if c.get("add_binary_head"):
        pooled = torch.tanh(dense(h[:, 0], "pooler.dense"))
        nsp_logits = dense(pooled, "cls.seq_relationship")  # (B, 2)
        nsp_labels = batch["next_sentence_labels"]
        nsp_loss = F.cross_entropy(nsp_logits, nsp_labels)
        out["loss"] = float(mlm_loss + nsp_loss)
        out["nsp_loss"] = float(nsp_loss)
        nsp_correct = float((nsp_logits.gather(1, nsp_labels[:, None])[:, 0] >= nsp_logits.max(dim=1).values).sum())
        nsp_count = float(B)
    out.update(mlm_correct=float((weights * correct).sum()), mlm_count=float(count),
               nsp_correct=nsp_correct, nsp_count=nsp_count)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("batch", help="BATCH.safetensors, or make-hf")
    parser.add_argument("--model", default="", help="the model config (JSON) of a Hugging Face file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--legacy", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.batch == "make-hf":
        make_huggingface(args.checkpoint, json.loads(args.model), args.seed, args.legacy)
        return
    if os.path.isfile(args.checkpoint):
        if not args.model:
            fail("Hugging Face weights need --model")
        model_config = json.loads(args.model)
        tensors = load_huggingface(args.checkpoint, model_config)
    else:
        tensors, model_config = load_checkpoint(args.checkpoint)
    batch = load_batch(args.batch, bool(model_config.get("add_binary_head")))
    check_ranges(batch, model_config)
    with torch.inference_mode():
        result = bert_forward(tensors, model_config, batch)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
