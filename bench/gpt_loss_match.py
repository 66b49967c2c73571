#!/usr/bin/env python3
"""Does our GPT-2 train as PyTorch does? (issue 40, item 4.) The same initial weights, the same
tokens in the same order and the same schedule for apps/gpt_train and for PyTorch eager
(bench/reference/gpt_torch.py's model, SDPA attention), losses compared step by step.

    python3 bench/gpt_loss_match.py --build-dir build-gpu --device cuda --config gpt2 \
        --batch-size 4 --seq-len 1024 --out $OUT/gpt2_loss_match.jsonl --md $OUT/gpt2_loss_match.md

PyTorch draws the weights (nanoGPT's initialisation, seed --seed) and saves them as a Hugging
Face GPT-2 folder (config.json, model.safetensors: "transformer." names, Conv1D weights stored
(in, out)), which gpt_train loads with --init-from. Two token files in llm.c's format, read by
both in gpt_train's order (window k is tokens [k B T, (k + 1) B T + 1)):

  text    a learnable stream: 256 random "phrases" of 32 tokens drawn from the whole vocabulary,
          concatenated in random order; a model that learns the phrases predicts 31 of every 32
          tokens, so the loss falls from ln(50257) = 10.82 towards ln(256) / 32 + ... ;
  random  uniform tokens, which no model can predict: the best loss is 10.82, and the last GPU
          run's bench (lr 1e-3, no warm-up, synthetic uniform tokens) ended at 11.99. Run here at
          that learning rate to see whether PyTorch does the same from the same weights.

Both in strict FP32 (TF32 off), AdamW (0.9, 0.95, eps 1e-8, weight decay 0.1 on 2-D parameters),
clipping at a global norm of 1, gpt_train's schedule (linear warm-up over --warmup-steps, then a
cosine to --min-lr-frac of the peak at the last step). One JSON line per (data, framework) with
every step's loss, then one per data set with the largest |ours - PyTorch| over the steps.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench", "reference"))


def log(msg):
    print(f"[gpt_loss_match {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_tokens(path, tokens):
    import numpy as np
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())
    os.replace(path + ".tmp", path)


def make_streams(n, vocab, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    phrases = rng.integers(0, vocab, (256, 32))
    order = rng.integers(0, 256, n // 32 + 1)
    text = phrases[order].reshape(-1)[:n]
    return {"text": text, "random": rng.integers(0, vocab, n)}


def save_hf(model, cfg, folder):
    """The model as Hugging Face's GPT2LMHeadModel saves it (what gpt_train --init-from reads)."""
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    tensors = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to wte
        t = p.detach().cpu().float()
        tensors[name] = (t.t() if name.endswith(conv1d) else t).contiguous()
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "vocab_size": cfg["vocab_size"], "n_positions": cfg["block_size"],
                   "n_layer": cfg["n_layer"], "n_head": cfg["n_head"], "n_embd": cfg["n_embd"],
                   "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "tie_word_embeddings": True}, f)


def lr_at(step, a):
    """gpt_train's schedule (apps/gpt_train/main.cpp, lr_at)."""
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    span = max(1.0, a.steps - a.warmup_steps - 1)
    progress = min(1.0, (step - a.warmup_steps) / span)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def torch_losses(model, tokens, a, cfg, dev):
    import torch
    import torch.nn.functional as F
    from gpt_torch import adamw
    opt = adamw(model, a.lr, 0.1)
    data = torch.as_tensor(tokens.astype("int64"))
    span, losses = a.batch_size * a.seq_len, []
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        start = step * span
        x = data[start:start + span].view(a.batch_size, a.seq_len).to(dev)
        y = data[start + 1:start + span + 1].view(a.batch_size, a.seq_len).to(dev)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x).view(-1, cfg["vocab_size"]), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build-gpu"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", default="gpt2")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=6e-4, help="peak learning rate on the text stream")
    ap.add_argument("--random-lr", type=float, default=1e-3, help="learning rate on the random stream (the bench's)")
    ap.add_argument("--warmup-steps", type=int, default=10, help="on the text stream (the random one has none)")
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--data", default="text,random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    import torch
    from gpt_torch import GPT, PRESETS, Attention
    Attention.use_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = PRESETS[a.config]
    dev = torch.device(a.device)
    tmp = tempfile.mkdtemp(prefix="gpt_loss_match_")
    torch.manual_seed(a.seed)
    init = GPT(**cfg)
    save_hf(init, cfg, os.path.join(tmp, "init"))
    n = a.steps * a.batch_size * a.seq_len + 1
    streams = make_streams(n, cfg["vocab_size"], a.seed + 1)
    gpu = None
    if dev.type == "cuda":
        gpu = torch.cuda.get_device_name(dev)
    common = {"workload": f"gpt_{a.config}", "batch": a.batch_size, "seq_len": a.seq_len, "precision": "fp32",
              "steps": a.steps, "gpu_name": gpu, "commit": a.commit or os.environ.get("MG_COMMIT"), "seed": a.seed}
    rows, out = [], open(a.out, "a") if a.out else None

    def emit(rec):
        rows.append(rec)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        log(json.dumps({k: v for k, v in rec.items() if k not in ("losses",)})[:400])

    for name in [d for d in a.data.split(",") if d]:
        b = argparse.Namespace(**vars(a))
        if name == "random":
            b.lr, b.warmup_steps = a.random_lr, 0
        path = os.path.join(tmp, f"{name}.bin")
        write_tokens(path, streams[name])
        base = dict(common, data=name, lr=b.lr, warmup_steps=b.warmup_steps, min_lr_frac=b.min_lr_frac)
        # Ours.
        js = os.path.join(tmp, f"ours_{name}.json")
        cmd = [os.path.join(a.build_dir, "bin", "gpt_train"), "--init-from", os.path.join(tmp, "init"), "--data", path,
               "--device", a.device, "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len), "--steps",
               str(a.steps), "--lr", str(b.lr), "--warmup-steps", str(b.warmup_steps), "--min-lr-frac",
               str(b.min_lr_frac), "--tf32", "off", "--json", js]
        log("run: " + " ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            emit(dict(base, framework="libminigrad", error=f"exit {p.returncode}: {(p.stderr or p.stdout)[-600:]}"))
            ours = None
        else:
            with open(js) as f:
                j = json.load(f)
            ours = j["losses"]
            emit(dict(base, framework="libminigrad", losses=ours, lrs=j.get("lr")))
        # PyTorch, from the same weights.
        model = GPT(**cfg)
        model.load_state_dict(init.state_dict())
        model.to(dev)
        theirs = torch_losses(model, streams[name], b, cfg, dev)
        emit(dict(base, framework="pytorch", losses=theirs, torch_version=torch.__version__))
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        if ours:
            diff = [abs(o - t) for o, t in zip(ours, theirs)]
            emit(dict(base, framework="compare", max_abs_diff=max(diff), argmax_step=diff.index(max(diff)) + 1,
                      first_loss=(ours[0], theirs[0]), last_loss=(ours[-1], theirs[-1]),
                      min_loss=(min(ours), min(theirs))))
    lines = ["| data | lr | steps | ours first / last / min | PyTorch first / last / min | max abs diff (step) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["framework"] == "compare":
            o = (r["first_loss"][0], r["last_loss"][0], r["min_loss"][0])
            t = (r["first_loss"][1], r["last_loss"][1], r["min_loss"][1])
            lines.append(f"| {r['data']} | {r['lr']:g} (warm-up {r['warmup_steps']}) | {r['steps']} | "
                         f"{o[0]:.4f} / {o[1]:.4f} / {o[2]:.4f} | {t[0]:.4f} / {t[1]:.4f} / {t[2]:.4f} | "
                         f"{r['max_abs_diff']:.2e} ({r['argmax_step']}) |")
        elif r.get("error"):
            lines.append(f"| {r['data']} | error: {r['error'][:200]} | | | | |")
    print("\n".join(lines))
    if a.md:
        with open(a.md, "w") as f:
            f.write(f"GPT-2 losses from the same weights, {a.config}, B = {a.batch_size}, T = {a.seq_len}, strict FP32; "
                    f"{gpu}; commit {common['commit']}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
