#!/usr/bin/env python3
"""Reference values for tests/test_resnet_torchvision.cpp, from torchvision's own ResNet-18.

Writes three safetensors files (with the safetensors package) into OUT_DIR:
  init.safetensors   torchvision.models.resnet18(num_classes=10).state_dict() after manual_seed(0):
                     torchvision's initialisation, names and layout, running statistics included
  batch.safetensors  x (4, 3, 64, 64) float32, target (4) int64; logits (training mode, from the
                     initial weights), loss; eval_logits (eval mode, after the step)
  step.safetensors   the state_dict after one SGD step (lr 0.1, momentum 0.9) on mean cross-entropy:
                     the weights, and the running statistics the training forward updated

    /usr/bin/python3 tests/reference/resnet18_torchvision.py OUT_DIR

Exit status 77 (ctest's skip) when torch, torchvision or safetensors cannot be imported.
"""
import os
import sys

try:
    import torch
    import torchvision
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover - what the test prints as its reason to skip
    print(f"resnet18_torchvision.py: cannot import {e.name}; install python3-torch, python3-torchvision "
          "and the safetensors package (scripts/setup.sh does)")
    sys.exit(77)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torchvision.models.resnet18(num_classes=10)
    model.train()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "init.safetensors"))

    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 3, 64, 64, generator=g) * 2 - 1
    target = torch.tensor([3, 1, 4, 1], dtype=torch.int64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.zero_grad()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, target)
    loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        eval_logits = model(x)
    save_file({"x": x, "target": target, "logits": logits.detach(), "loss": loss.detach().reshape(1),
               "eval_logits": eval_logits}, os.path.join(out, "batch.safetensors"))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "step.safetensors"))
    print(f"resnet18_torchvision.py: torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"loss {loss.item():.6f}, files in {out}")


if __name__ == "__main__":
    main()
