#!/usr/bin/python3
"""Writes a checkpoint of random bf16 weights in the shape of a real model, for benchmarks.

The weights are normal(0, 0.02), the norms ones: the outputs mean nothing, the arithmetic is that
of the real model. No tokenizer files: it takes token ids. Needs numpy (Debian's python3-numpy).

    /usr/bin/python3 models/random_checkpoint.py --shape qwen2-0.5b --out /tmp/qwen2-0.5b-random
"""
import argparse
import json
import os
import struct

import numpy as np

SHAPES = {
    # Qwen2-0.5B: 24 layers of width 896, 14 query heads on 2 KV heads of 64, MLP 4864, tied
    # embeddings of 151,936 tokens; q, k and v have biases.
    "qwen2-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151643,
    },
}


def bf16_bytes(a):
    """float32 array -> bf16 bytes, rounded to nearest even."""
    u = a.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    cfg = SHAPES[args.shape]
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd = d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    rng = np.random.default_rng(args.seed)
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,)}
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        shapes.update({
            pre + "self_attn.q_proj.weight": (q, d), pre + "self_attn.q_proj.bias": (q,),
            pre + "self_attn.k_proj.weight": (kv, d), pre + "self_attn.k_proj.bias": (kv,),
            pre + "self_attn.v_proj.weight": (kv, d), pre + "self_attn.v_proj.bias": (kv,),
            pre + "self_attn.o_proj.weight": (d, q),
            pre + "mlp.gate_proj.weight": (f, d), pre + "mlp.up_proj.weight": (f, d),
            pre + "mlp.down_proj.weight": (d, f),
            pre + "input_layernorm.weight": (d,), pre + "post_attention_layernorm.weight": (d,),
        })
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as out:
        out.write(struct.pack("<Q", len(h)))
        out.write(h)
        for name, shape in shapes.items():
            if name.endswith("norm.weight"):
                a = np.ones(shape, np.float32)
            else:
                a = rng.standard_normal(shape, dtype=np.float32) * 0.02
            out.write(bf16_bytes(a))
    with open(os.path.join(args.out, "config.json"), "w") as out:
        json.dump(cfg, out, indent=2)
    print(f"{args.shape}: {sum(int(np.prod(s)) for s in shapes.values()) / 1e6:.1f}M parameters in {args.out}")


if __name__ == "__main__":
    main()
