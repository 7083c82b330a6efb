#!/usr/bin/env python3
"""Trains the VeriCache test model: a small Llama-architecture byte-level code model.

Corpus: the Python standard library of this machine (/usr/lib/python3.X, without site/dist-packages).
Held-out split: files whose SHA-256(relative path) is 0 mod 20 (about 5%).

The script resumes from its last training state (--state-dir), so it can be stopped and started again.
`--export` writes the Hugging Face-layout checkpoint (config.json, model.safetensors in bf16) and the
reference outputs used by the C++ tests (computed in float32 from the bf16-rounded weights).

Commands (see models/vc-code-4m/README.md for the ones used for the shipped checkpoint):
  LD_PRELOAD=libtcmalloc_minimal.so.4 /usr/bin/python3 models/train.py train --minutes 60
  /usr/bin/python3 models/train.py export --out models/vc-code-4m
  /usr/bin/python3 models/train.py kv-reference --out models/vc-code-4m

`kv-reference` needs no training state: it reads the shipped checkpoint and writes the same
references with K and V rounded to bf16 where the C++ engine rounds them (K after RoPE, V after its
projection), as a cache of the checkpoint's own dtype holds them.
"""
import argparse
import glob
import hashlib
import json
import math
import os
import random
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BOS, EOS, VOCAB = 256, 257, 258

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "vocab_size": VOCAB,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "torch_dtype": "bfloat16",
    "tokenizer_class": "vericache-byte",
}

# The schedule runs on training wall time (--minutes in all, across resumes), so a run shares the
# machine with other work and still ends with a decayed learning rate and a long-context phase:
# context 512 (batch 32) for the first 80% of the time, then context 2048 (batch 8); 16 KiB a step.
PHASES = [(0.8, 512, 32), (1.0, 2048, 8)]
PEAK_LR, MIN_LR, WARMUP = 2e-3, 1e-4, 100


# ----------------------------------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(head_dim, positions, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = positions.double()[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    # x: [B, H, T, D]; Hugging Face convention: rotate the two halves of each head.
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = cos[None, None].to(x.dtype)
    s = sin[None, None].to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


# The dtype K and V are rounded to before attention (None: kept in float32), as a KV cache of that
# dtype would hold them.
KV_ROUND = None


def round_kv(x):
    return x if KV_ROUND is None else x.to(KV_ROUND).float()


# The dtype the input of every linear layer is rounded to (None: kept in float32), as kernels with
# bf16 products (the engine's avx512bf16 backend) round it.
LINEAR_INPUT_ROUND = None


class Linear(nn.Linear):
    def forward(self, x):
        if LINEAR_INPUT_ROUND is not None:
            x = x.to(LINEAR_INPUT_ROUND).float()
        return super().forward(x)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.h, self.kv, self.hd = h, kv, hd
        self.input_layernorm = RMSNorm(d, cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d, cfg["rms_norm_eps"])
        self.q_proj = Linear(d, h * hd, bias=False)
        self.k_proj = Linear(d, kv * hd, bias=False)
        self.v_proj = Linear(d, kv * hd, bias=False)
        self.o_proj = Linear(h * hd, d, bias=False)
        f = cfg["intermediate_size"]
        self.gate_proj = Linear(d, f, bias=False)
        self.up_proj = Linear(d, f, bias=False)
        self.down_proj = Linear(f, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(y).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(y).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = round_kv(k), round_kv(v)
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.float().masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype)
        a = att @ v
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
                if n.endswith("o_proj.weight") or n.endswith("down_proj.weight"):
                    p.data.mul_(1 / math.sqrt(2 * cfg["num_hidden_layers"]))

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = rope_tables(self.cfg["head_dim"], torch.arange(T), self.cfg["rope_theta"])
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def hf_state(self):
        """Parameters under Hugging Face Llama names."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight,
               "model.norm.weight": self.norm.weight,
               "lm_head.weight": self.lm_head.weight}
        for i, l in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = l.input_layernorm.weight
            out[p + "post_attention_layernorm.weight"] = l.post_attention_layernorm.weight
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{n}.weight"] = getattr(l, n).weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(l, n).weight
        return out


# ------------------------------------------------------------------------------------------ data

def corpus_files():
    roots = sorted(glob.glob("/usr/lib/python3.[0-9]*"))
    if not roots:
        sys.exit("no /usr/lib/python3.X found")
    root = roots[-1]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        for n in sorted(names):
            if n.endswith(".py"):
                files.append(os.path.join(d, n))
    return root, files


def is_heldout(rel):
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 20 == 0


def encode_docs(docs):
    """BOS + bytes + EOS per document, as one int16 stream."""
    out = []
    for d in docs:
        out.append(BOS)
        out.extend(d)
        out.append(EOS)
    return torch.tensor(out, dtype=torch.int16)


def stream_of(root, heldout):
    _, files = corpus_files()
    docs = []
    for f in files:
        rel = os.path.relpath(f, root)
        if is_heldout(rel) == heldout:
            with open(f, "rb") as fh:
                data = fh.read()
            if data:
                docs.append(data)
    return encode_docs(docs)


def batch(stream, ctx, bs, gen):
    hi = len(stream) - ctx - 1
    starts = torch.randint(0, hi, (bs,), generator=gen)
    x = torch.stack([stream[s:s + ctx + 1].long() for s in starts.tolist()])
    return x[:, :-1], x[:, 1:]


@torch.no_grad()
def heldout_bpb(model, held, ctx, n_windows=48, seed=1234):
    """Mean bits per byte over fixed held-out windows (all positions of each window scored)."""
    g = torch.Generator().manual_seed(seed)
    model.eval()
    total, count = 0.0, 0
    for _ in range(n_windows // 8):
        x, y = batch(held, ctx, 8, g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), reduction="sum")
        total += loss.item()
        count += y.numel()
    model.train()
    return total / count / math.log(2)


def lr_at(step, progress):
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    t = min(1.0, progress)
    return MIN_LR + 0.5 * (PEAK_LR - MIN_LR) * (1 + math.cos(math.pi * t))


def phase_at(progress):
    for end, ctx, bs in PHASES:
        if progress < end:
            return ctx, bs
    return PHASES[-1][1], PHASES[-1][2]


# ----------------------------------------------------------------------------------------- train

def train(args):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    root, _ = corpus_files()
    tr, held = stream_of(root, False), stream_of(root, True)
    print(f"corpus {root}: train {len(tr)} tokens, held-out {len(held)} tokens", flush=True)
    os.makedirs(args.state_dir, exist_ok=True)
    state_path = os.path.join(args.state_dir, "state.pt")
    model = Model(CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.95), weight_decay=0.1)
    step, seen, log, trained_s = 0, 0, [], 0.0
    if os.path.exists(state_path):
        st = torch.load(state_path)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, seen, log = st["step"], st["seen"], st["log"]
        trained_s = st.get("trained_s", args.assume_trained_minutes * 60)
        print(f"resumed at step {step}, {seen} bytes seen, {trained_s / 60:.1f} min trained", flush=True)
    budget_s = args.minutes * 60
    gen = torch.Generator().manual_seed(1000 + step)

    def save():
        tmp = state_path + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seen": seen,
                    "log": log, "trained_s": trained_s}, tmp)
        os.replace(tmp, state_path)

    t0 = time.time()
    last_save = t0
    t_prev = t0
    while trained_s < budget_s:
        progress = trained_s / budget_s
        ctx, bs = phase_at(progress)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, progress)
        x, y = batch(tr, ctx, bs, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += x.numel()
        now = time.time()
        trained_s += now - t_prev
        t_prev = now
        if step % 20 == 0:
            print(f"step {step} ctx {ctx} loss {loss.item() / math.log(2):.3f} bits/byte "
                  f"lr {lr_at(step, progress):.2e} seen {seen} progress {progress:.3f}", flush=True)
        if step % 250 == 0 or trained_s >= budget_s:
            bpb = heldout_bpb(model, held, ctx)
            log.append({"step": step, "ctx": ctx, "heldout_bpb": bpb, "seen": seen})
            print(f"== step {step} held-out {bpb:.3f} bits/byte at ctx {ctx}", flush=True)
            save()
            last_save = time.time()
        elif time.time() - last_save > 300:
            save()
            last_save = time.time()
    save()
    print(f"stopped at step {step}", flush=True)


# ---------------------------------------------------------------------------------------- export

def write_safetensors(path, tensors, metadata):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
            dt = "BF16"
        else:
            raw = t.float().numpy().tobytes()
            dt = "F32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


@torch.no_grad()
def greedy(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1]
        ids.append(int(torch.argmax(logits).item()))  # torch.argmax returns the first maximum
    return ids


def export(args):
    torch.set_num_threads(args.threads)
    st = torch.load(os.path.join(args.state_dir, "state.pt"))
    model = Model(CONFIG)
    model.load_state_dict(st["model"])
    # Round to bf16 (the shipped dtype) and compute the references in float32 from the rounded weights.
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16).float()
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    cfg = dict(CONFIG)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    tensors = {k: v.to(torch.bfloat16) for k, v in model.hf_state().items()}
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors, {"format": "pt"})

    root, _ = corpus_files()
    held = stream_of(root, True)
    ctx = PHASES[-1][1]
    full_bpb = heldout_bpb(model, held, ctx, n_windows=96)

    # Reference data from held-out code (never trained on).
    _, files = corpus_files()
    held_files = [f for f in files if is_heldout(os.path.relpath(f, root))]
    rng = random.Random(7)
    long_doc = None
    for f in held_files:
        with open(f, "rb") as fh:
            d = fh.read()
        if len(d) >= 3000:
            long_doc = (os.path.relpath(f, root), d)
            break
    ids = [BOS] + list(long_doc[1][:1599])
    logits = model(torch.tensor([ids]))[0]
    positions = [0, 1, 2, 15, 16, 17, 255, 511, 1000, 1023, 1024, 1337, 1599]
    logit_refs = {"source": long_doc[0], "input_ids": ids, "positions": positions,
                  "logits": [[float(v) for v in logits[p].tolist()] for p in positions]}

    prompts = [
        "def fibonacci(n):\n",
        "import os\nimport sys\n\n\ndef main(argv):\n",
        "class Stack:\n    \"\"\"A simple LIFO stack.\"\"\"\n\n    def __init__(self):\n",
        "    for i, line in enumerate(lines):\n        if ",
    ]
    # A long prompt: 1200 bytes of held-out code.
    rel, d = held_files[rng.randrange(len(held_files))], None
    for f in held_files[3:]:
        with open(f, "rb") as fh:
            d = fh.read()
        if len(d) > 2000:
            rel = os.path.relpath(f, root)
            break
    long_prompt = d[:1200].decode("utf-8", "replace")
    greedy_refs = []
    for p in prompts + [long_prompt]:
        pid = [BOS] + list(p.encode())
        out = greedy(model, pid, 48)
        greedy_refs.append({"prompt_ids": pid, "continuation_ids": out[len(pid):],
                            "text": bytes(t for t in out[len(pid):] if t < 256).decode("utf-8", "replace")})
    refdir = os.path.join(args.out, "reference")
    os.makedirs(refdir, exist_ok=True)
    with open(os.path.join(refdir, "logits.json"), "w") as f:
        json.dump(logit_refs, f)
    with open(os.path.join(refdir, "greedy.json"), "w") as f:
        json.dump({"steps": 48, "cases": greedy_refs}, f, indent=1)
    n_params = sum(p.numel() for p in model.parameters())
    summary = {"params": n_params, "steps": st["step"], "bytes_seen": st["seen"], "log": st["log"],
               "heldout_bpb_bf16_weights": full_bpb, "heldout_eval_ctx": ctx,
               "samples": [{"prompt": prompts[i], "greedy": greedy_refs[i]["text"]} for i in range(3)]}
    with open(os.path.join(args.out, "training_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "log"}, indent=1))


def read_safetensors(path):
    """The tensors of a safetensors file, as float32."""
    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = bytearray(data[a:b])
        out[name] = torch.frombuffer(raw, dtype=dtypes[t["dtype"]]).reshape(t["shape"]).float()
    return out


def kv_reference(args):
    """References for K and V kept in bf16, and for linear inputs rounded to bf16 with K and V in
    float32 and in bf16, from the shipped checkpoint (no training state)."""
    global KV_ROUND, LINEAR_INPUT_ROUND
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.out, "config.json")) as f:
        cfg = json.load(f)
    model = Model(cfg)
    weights = read_safetensors(os.path.join(args.out, "model.safetensors"))
    state = model.hf_state()
    for name, p in state.items():
        p.data.copy_(weights[name])
    model.eval()
    refdir = os.path.join(args.out, "reference")
    with open(os.path.join(refdir, "logits.json")) as f:
        base = json.load(f)
    with open(os.path.join(refdir, "greedy.json")) as f:
        gbase = json.load(f)
    for kv, linear_input, suffix in ((torch.bfloat16, None, "_kv_bf16"),
                                     (None, torch.bfloat16, "_bf16_products"),
                                     (torch.bfloat16, torch.bfloat16, "_kv_bf16_bf16_products")):
        KV_ROUND, LINEAR_INPUT_ROUND = kv, linear_input
        with torch.no_grad():
            logits = model(torch.tensor([base["input_ids"]]))[0]
        logit_refs = dict(base)
        logit_refs["kv_dtype"] = "bf16" if kv is not None else "f32"
        logit_refs["linear_input"] = "bf16" if linear_input is not None else "f32"
        logit_refs["logits"] = [[float(v) for v in logits[p].tolist()] for p in base["positions"]]
        cases = []
        for c in gbase["cases"]:
            out = greedy(model, c["prompt_ids"], gbase["steps"])
            cont = out[len(c["prompt_ids"]):]
            cases.append({"prompt_ids": c["prompt_ids"], "continuation_ids": cont,
                          "text": bytes(t for t in cont if t < 256).decode("utf-8", "replace")})
        with open(os.path.join(refdir, f"logits{suffix}.json"), "w") as f:
            json.dump(logit_refs, f)
        with open(os.path.join(refdir, f"greedy{suffix}.json"), "w") as f:
            json.dump({"steps": gbase["steps"], "kv_dtype": logit_refs["kv_dtype"],
                       "linear_input": logit_refs["linear_input"], "cases": cases}, f, indent=1)
        same = sum(a["continuation_ids"] == b["continuation_ids"] for a, b in zip(cases, gbase["cases"]))
        print(f"wrote {refdir}/logits{suffix}.json and greedy{suffix}.json; "
              f"{same} of {len(cases)} greedy continuations equal the float32 ones")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["train", "export", "kv-reference"])
    ap.add_argument("--state-dir", default=os.path.join(os.path.dirname(__file__), ".train"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "vc-code-4m"))
    ap.add_argument("--minutes", type=float, default=60, help="training wall time in all, across resumes")
    ap.add_argument("--assume-trained-minutes", type=float, default=0,
                    help="wall time already spent by a state saved before the schedule recorded it")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    {"train": train, "export": export, "kv-reference": kv_reference}[args.cmd](args)


if __name__ == "__main__":
    main()
