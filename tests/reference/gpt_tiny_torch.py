#!/usr/bin/env python3
"""Reference values for tests/test_gpt.cpp: a tiny GPT-2 in PyTorch, written as nanoGPT writes it
(torch.nn.Linear layout, Hugging Face's parameter names, lm_head tied to wte), trained three steps
with AdamW (betas 0.9, 0.95; weight decay 0.1 on 2-D parameters only) and gradient clipping at a
global norm of 1.0, on mean cross-entropy with some target positions ignored (-100).

Config: vocab 512, context 64, 2 layers, 4 heads, width 64; batch 4 x 32 tokens.

Writes into OUT_DIR (with the safetensors package):
  init.safetensors    the initial state_dict (lm_head.weight left out: it is wte)
  batch.safetensors   tokens (4, 32) int64, targets (4, 32) int64 (-100 at ignored positions),
                      logits (4, 32, 512) and loss from the initial weights, losses (3) of the steps
  steps.safetensors   the parameters after the three steps

    /usr/bin/python3 tests/reference/gpt_tiny_torch.py OUT_DIR

Exit status 77 (ctest's skip) when torch or safetensors cannot be imported.
"""
import math
import os
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import save_file
except ImportError as e:
    print(f"gpt_tiny_torch.py: cannot import {e.name}; install python3-torch and the safetensors package "
          "(scripts/setup.sh does)")
    sys.exit(77)

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 512, 64, 2, 4, 64
BATCH, T = 4, 32


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.c_proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(VOCAB, WIDTH), wpe=nn.Embedding(CONTEXT, WIDTH),
                                              h=nn.ModuleList([Block() for _ in range(LAYERS)]),
                                              ln_f=nn.LayerNorm(WIDTH)))
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        for name, p in self.named_parameters():  # nanoGPT's initialisation
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * LAYERS))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif ".ln_" not in name:
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def state(model):
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT()
    save_file(state(model), os.path.join(out, "init.safetensors"))

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, T), generator=g)
    targets = torch.randint(0, VOCAB, (BATCH, T), generator=g)
    targets[0, -5:] = -100  # padding at the end of a sequence
    targets[2, 7] = -100
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    logits0 = loss0 = None
    losses = []
    for step in range(3):
        opt.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=-100)
        if step == 0:
            logits0, loss0 = logits.detach().clone(), loss.detach().clone()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    save_file({"tokens": tokens, "targets": targets, "logits": logits0, "loss": loss0.reshape(1),
               "losses": torch.tensor(losses, dtype=torch.float32)}, os.path.join(out, "batch.safetensors"))
    save_file(state(model), os.path.join(out, "steps.safetensors"))
    print(f"gpt_tiny_torch.py: torch {torch.__version__}, losses {losses}, files in {out}")


if __name__ == "__main__":
    main()
