#!/usr/bin/env python3
"""PyTorch reference for apps/gpt_train: the same GPT-2 (nanoGPT's layout and initialisation,
Hugging Face's parameter names, lm_head tied to wte, GELU tanh, causal attention written out as
nanoGPT's CPU path does), trained the same way: AdamW (betas 0.9, 0.95, eps 1e-8, weight decay on
2-D parameters only), gradient clipping at a global norm of 1, mean cross-entropy over B x T
next tokens, on the same synthetic stream shape. Prints one JSON line: tokens/s, median step.

    /usr/bin/python3 bench/reference/gpt_torch.py --config small --batch-size 8 --seq-len 128 --steps 20 --threads 2

Also the model of tests/reference/gpt_tiny_torch.py (imported from here).
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"tiny": dict(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=64),
           "small": dict(vocab_size=8192, block_size=256, n_layer=4, n_head=4, n_embd=128),
           "gpt2": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
           # GPT-2's ops at a width where a step is the framework's cost per op (apps/gpt_train's "ops")
           "ops": dict(vocab_size=96, block_size=1024, n_layer=12, n_head=12, n_embd=48)}


class Attention(nn.Module):
    use_sdpa = False  # --sdpa: torch's fused scaled_dot_product_attention (PyTorch >= 2.0)

    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if Attention.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(c), Attention(c, heads), nn.LayerNorm(c), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
                                              h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
                                              ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        for name, p in self.named_parameters():  # nanoGPT's initialisation
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif ".ln_" not in name:
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def adamw(model, lr, weight_decay):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sdpa", action="store_true", help="torch's fused attention (PyTorch >= 2.0)")
    ap.add_argument("--tf32", action="store_true", help="CUDA: matrix products in TF32 (allow_tf32)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: forward and loss under torch.autocast(bfloat16), fp32 parameters and optimizer")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    autocast = torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.precision == "bf16")
    if args.sdpa:
        if not hasattr(F, "scaled_dot_product_attention"):
            raise SystemExit(f"--sdpa needs PyTorch >= 2.0 (this is {torch.__version__})")
        Attention.use_sdpa = True
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = PRESETS[args.config]
    t = args.seq_len or cfg["block_size"]
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    model = GPT(**cfg).to(dev)
    opt = adamw(model, 1e-3, 0.1)
    g = torch.Generator().manual_seed(args.seed + 1)
    stream = torch.randint(0, cfg["vocab_size"], (args.batch_size * t * args.accum * 4 + 1,), generator=g)
    span = args.batch_size * t
    pos = 0

    def step():
        nonlocal pos
        opt.zero_grad(set_to_none=False)
        total = 0.0
        for _ in range(args.accum):
            if pos + span + 1 > stream.numel():
                pos = 0
            x = stream[pos:pos + span].view(args.batch_size, t).to(dev)
            y = stream[pos + 1:pos + span + 1].view(args.batch_size, t).to(dev)
            pos += span
            with autocast:
                loss = F.cross_entropy(model(x).view(-1, cfg["vocab_size"]), y.view(-1)) / args.accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return total

    for _ in range(args.warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    tokens = args.batch_size * t * args.accum
    print(json.dumps({"framework": "pytorch", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
                      "workload": f"gpt_{args.config}_b{args.batch_size}_t{t}_a{args.accum}", "device": str(dev),
                      "median_step_s": med, "tokens_per_s": tokens / med, "final_loss": loss,
                      "params": sum(p.numel() for p in model.parameters()), "sdpa": args.sdpa,
                      "tf32": args.tf32, "precision": args.precision,
                      "peak_cuda_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)


if __name__ == "__main__":
    main()
