#!/usr/bin/env python3
"""Reference values for tests/test_precision_torch.cpp: an MLP 64-128-128-10 trained 20 steps with
SGD (lr 0.05, momentum 0.9) on one batch of 64 random samples, mean cross-entropy, from the same
initial weights twice: in float32, and under PyTorch's CPU autocast to bfloat16.

Writes into OUT_DIR (with the safetensors package):
  init.safetensors   the initial state_dict, the batch (x (64, 64) float32, y (64) int64)
  fp32.safetensors   the weights after 20 float32 steps, and "losses" (20) of those steps
  bf16.safetensors   the same under torch.autocast("cpu", dtype=torch.bfloat16)

    /usr/bin/python3 tests/reference/mlp_bf16_torch.py OUT_DIR

Exit status 77 (ctest's skip) when torch or safetensors cannot be imported.
"""
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
except ImportError as e:
    print(f"mlp_bf16_torch.py: cannot import {e.name}; install python3-torch and the safetensors package "
          "(scripts/setup.sh with MG_TEST_DEPS=1 does)")
    sys.exit(77)

STEPS, BATCH, LR, MOMENTUM = 20, 64, 0.05, 0.9


def make():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def train(init, x, y, bf16):
    model = make()
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.float().backward()
        opt.step()
        losses.append(float(loss))
    out = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    init = {k: v.detach().clone().contiguous() for k, v in make().state_dict().items()}
    x = torch.randn(BATCH, 64)
    y = torch.randint(0, 10, (BATCH,))
    save_file({**init, "x": x, "y": y}, os.path.join(out_dir, "init.safetensors"))
    save_file(train(init, x, y, False), os.path.join(out_dir, "fp32.safetensors"))
    save_file(train(init, x, y, True), os.path.join(out_dir, "bf16.safetensors"))
    print(f"mlp_bf16_torch.py: wrote {out_dir} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
