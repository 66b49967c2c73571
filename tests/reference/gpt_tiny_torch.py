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
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
except ImportError as e:
    print(f"gpt_tiny_torch.py: cannot import {e.name}; install python3-torch and the safetensors package "
          "(scripts/setup.sh does)")
    sys.exit(77)

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 512, 64, 2, 4, 64
BATCH, T = 4, 32

# The model is the benchmark's (bench/reference/gpt_torch.py): one definition for both.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "reference"))
from gpt_torch import GPT, adamw  # noqa: E402


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
    model = GPT(VOCAB, CONTEXT, LAYERS, HEADS, WIDTH)
    save_file(state(model), os.path.join(out, "init.safetensors"))

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, T), generator=g)
    targets = torch.randint(0, VOCAB, (BATCH, T), generator=g)
    targets[0, -5:] = -100  # padding at the end of a sequence
    targets[2, 7] = -100
    opt = adamw(model, 3e-3, 0.1)
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
