#!/usr/bin/python3
"""A tiny Llama in plain PyTorch: the reference for llama_pytorch_test.cc.

Written from the semantics of HuggingFace's LlamaForCausalLM (RMSNorm in float,
rotate_half rotary embedding with inv_freq = 1 / theta^(2i/dim) computed in
float32 as HF does, and rescaled as HF's rope_scaling type "llama3" says when
the config has one, repeat_kv for grouped-query attention, a head_dim that
need not be hidden / heads, SwiGLU MLP, causal softmax attention), with
Conveyor's parameter names (layers.<i>.<hf name>). No transformers package
ships in Debian, so the model is spelled out here.

Runs in float64 from the float32 init file Conveyor wrote, so that it is the
exact answer Conveyor's float32 run is compared with. Reads the byte corpus
the way Conveyor's `tokens` data source does (window w = tokens[w*L, w*L+L+1),
position p -> window p mod N, step s -> positions [s*B, (s+1)*B)), trains with
torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW, and writes a safetensors
file with `logits` (the initial model on step 0's inputs), `losses` (one per
step) and every parameter after the last step; with rope_scaling also
`logits_unscaled`, the initial logits without it.

Usage: llama_reference.py INIT.safetensors CORPUS OUT.safetensors CONFIG_JSON
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: expected F32, got {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=torch.float32).reshape(
            info["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        blob = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama3_inv_freq(inv_freq, scaling):
    # HF's "llama3" rope type (Llama 3.1 and later): wavelengths shorter than
    # original / high_freq_factor keep their frequency, longer than
    # original / low_freq_factor are divided by factor, and those between are
    # blended by how far they lie between the two, all in float32.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) * ~(wavelen > original / low)
    return torch.where(medium, smoothed, scaled)


def rotary_cos_sin(seq, head_dim, theta, scaling, dtype, positions=None):
    # As HF's LlamaRotaryEmbedding: float32 frequencies and angles. With
    # `positions` [batch, seq] (HF's position_ids, restarting at each packed
    # document), cos and sin are [batch, 1, seq, head_dim].
    inv_freq = 1.0 / (theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is not None:
        if scaling["rope_type"] != "llama3":
            raise ValueError(f"unsupported rope_type {scaling['rope_type']}")
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    if positions is None:
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
    else:
        angles = (positions.float()[..., None] * inv_freq).unsqueeze(1)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def documents(ids, eod):
    # Megatron's --reset-position-ids / --reset-attention-mask: the token
    # after an EOD starts a new document. Returns each token's document
    # (segment) within its row and its position within that document.
    b, s = ids.shape
    starts = torch.zeros(b, s, dtype=torch.bool)
    starts[:, 1:] = ids[:, :-1] == eod
    segments = starts.long().cumsum(dim=1)
    t = torch.arange(s).expand(b, s)
    first = torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values
    return segments, t - first


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["features"] // cfg["heads"]


def attention(x, p, prefix, cfg, cos, sin, segments=None):
    b, s, d = x.shape
    h, g = cfg["heads"], cfg["kv_heads"]
    hd = head_dim(cfg)

    def project(name, heads):
        y = F.linear(x, p[prefix + name + ".weight"],
                     p.get(prefix + name + ".bias"))
        return y.view(b, s, heads, hd).transpose(1, 2)

    q, k, v = project("q_proj", h), project("k_proj", g), project("v_proj", g)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    # HF's repeat_kv: each key/value head serves h / g consecutive heads.
    k = k.repeat_interleave(h // g, dim=1)
    v = v.repeat_interleave(h // g, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    masked = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    if segments is not None:
        # Block-diagonal causal: a query sees its own document's keys only.
        masked = masked | (segments[:, None, :, None] !=
                           segments[:, None, None, :])
    probs = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
    context = (probs @ v).transpose(1, 2).reshape(b, s, h * hd)
    return F.linear(context, p[prefix + "o_proj.weight"])


def mlp(x, p, prefix):
    gate = F.linear(x, p[prefix + "gate_proj.weight"])
    up = F.linear(x, p[prefix + "up_proj.weight"])
    return F.linear(F.silu(gate) * up, p[prefix + "down_proj.weight"])


def forward(p, ids, cfg):
    blocks, eps = cfg["blocks"], cfg["rms_eps"]
    x = p["layers.0.weight"][ids]
    segments = positions = None
    if cfg.get("eod") is not None:
        segments, positions = documents(ids, cfg["eod"])
    cos, sin = rotary_cos_sin(ids.shape[1], head_dim(cfg), cfg["rope_theta"],
                              cfg.get("rope_scaling"), x.dtype,
                              positions if cfg.get("reset_position_ids") else
                              None)
    if not cfg.get("document_mask"):
        segments = None
    for i in range(1, blocks + 1):
        pre = f"layers.{i}."
        x = x + attention(rms_norm(x, p[pre + "input_layernorm.weight"], eps),
                          p, pre + "self_attn.", cfg, cos, sin, segments)
        x = x + mlp(rms_norm(x, p[pre + "post_attention_layernorm.weight"],
                             eps), p, pre + "mlp.")
    x = rms_norm(x, p[f"layers.{blocks + 1}.weight"], eps)
    # Tied: the output projection is the embedding matrix itself, as HF's
    # tie_word_embeddings makes it; autograd sums its two gradients.
    head = "layers.0.weight" if cfg["tied"] else f"layers.{blocks + 2}.weight"
    return F.linear(x, p[head])


def batch(corpus, step, cfg):
    seq, size = cfg["seq"], cfg["batch"]
    windows = (len(corpus) - 1) // seq
    rows = []
    for position in range(step * size, (step + 1) * size):
        w = position % windows
        rows.append(list(corpus[w * seq:w * seq + seq + 1]))
    t = torch.tensor(rows, dtype=torch.int64)
    return t[:, :-1], t[:, 1:]


def main():
    init_path, corpus_path, out_path, cfg = sys.argv[1:5]
    cfg = json.loads(cfg)
    torch.set_num_threads(1)
    with open(corpus_path, "rb") as f:
        corpus = f.read()
    params = {name: t.to(torch.float64).requires_grad_(True)
              for name, t in read_safetensors(init_path).items()}
    out = {}
    with torch.no_grad():
        out["logits"] = forward(params, batch(corpus, 0, cfg)[0], cfg)
        if cfg.get("rope_scaling") is not None:
            # The same model without its RoPE scaling: what the test checks
            # differs from the logits by far more than its tolerance, so
            # that the scaling is seen at this sequence length.
            plain = dict(cfg, rope_scaling=None)
            out["logits_unscaled"] = forward(
                params, batch(corpus, 0, cfg)[0], plain)
        if cfg.get("eod") is not None:
            # The same rows as one sequence each: what the documents change.
            out["logits_undocumented"] = forward(
                params, batch(corpus, 0, cfg)[0], dict(cfg, eod=None))
    optimizer = torch.optim.AdamW(
        params.values(), lr=cfg["lr"], betas=tuple(cfg["betas"]),
        eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    losses = []
    for step in range(cfg["steps"]):
        inputs, targets = batch(corpus, step, cfg)
        optimizer.zero_grad()
        logits = forward(params, inputs, cfg)
        if cfg.get("eod_mask_loss"):
            # Megatron's --eod-mask-loss: no loss where the input is the EOD
            # (the prediction across documents); each microbatch's loss is
            # the mean over its other targets, and the step's the mean of
            # the microbatches' (Conveyor's gradient accumulation).
            targets = targets.masked_fill(inputs == cfg["eod"], -100)
            m = cfg["microbatches"]
            rows = inputs.shape[0] // m
            loss = sum(F.cross_entropy(
                logits[j * rows:(j + 1) * rows].reshape(-1, logits.shape[-1]),
                targets[j * rows:(j + 1) * rows].reshape(-1),
                ignore_index=-100) for j in range(m)) / m
        else:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), cfg["clip"])
        optimizer.step()
        losses.append(loss.item())
    out["losses"] = torch.tensor(losses, dtype=torch.float64)
    out.update(params)
    write_safetensors(out_path, out)


if __name__ == "__main__":
    main()
