#!/usr/bin/env python3
"""Reference values for tests/test_precision_torch.cpp: four models trained 20 steps on one batch
from the same initial weights twice, in float32 and under PyTorch's CPU autocast to bfloat16.

  mlp     MLP 64-128-128-10, SGD (lr 0.05, momentum 0.9), mean cross-entropy over 64 random samples
  gpt     the tiny GPT-2 of tests/reference/gpt_tiny_torch.py (vocab 512, context 64, 2 layers,
          4 heads, width 64), AdamW (lr 1e-3, betas 0.9, 0.95, weight decay 0.1 on 2-D parameters),
          clipping at norm 1, mean cross-entropy over 4 x 32 random tokens
  vgg     VGG16 with widths / 8 as mg::nn::make_vgg16(10, 8, 0) builds it (one flat Sequential, no
          dropout), SGD (lr 0.05, momentum 0.9), mean cross-entropy over 64 random 32x32 images
  resnet  torchvision's ResNet-18 (10 classes, BatchNorm in training mode), SGD (lr 3e-4, momentum
          0.9), the same batch: a rate at which PyTorch's own bf16 and fp32 losses stay within 2e-2
          (the batch is learnt by heart within 20 steps; faster, the two drift apart by more)

Writes into OUT_DIR (with the safetensors package), for each model M:
  M_init.safetensors   the initial state_dict and the batch (x, y), and "conv_probe_error": how far
                       PyTorch's bf16 autocast convolution lies from the float32 sums of bf16 inputs
                       rounded once, on this CPU (about 2e-3, the output's rounding, where oneDNN
                       has bf16 kernels; PyTorch 1.13 on a CPU without AVX-512 measured 2.7e-2, its
                       sums kept in bf16: its bf16 CNN runs are then no reference for ours)
  M_fp32.safetensors   the weights after 20 float32 steps, and "losses" (20)
  M_bf16.safetensors   the same under torch.autocast("cpu", dtype=torch.bfloat16); not made for vgg
                       and resnet where the probe's error is over CONV_PROBE_BOUND (the test makes no
                       comparison with them there, and PyTorch's bf16 convolutions without oneDNN's
                       bf16 kernels are its slowest part: most of the test's time on an AVX2 CPU)

    /usr/bin/python3 tests/reference/precision_torch.py OUT_DIR

Exit status 77 (ctest's skip) when torch or safetensors cannot be imported.
"""
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    import torchvision
    from safetensors.torch import save_file
except ImportError as e:
    print(f"precision_torch.py: cannot import {e.name}; install python3-torch, python3-torchvision and the safetensors package "
          "(scripts/setup.sh with MG_TEST_DEPS=1 does)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "reference"))
from gpt_torch import GPT, adamw  # noqa: E402

STEPS = 20
# tests/test_precision_torch.cpp's kConvProbeBound: over it, PyTorch's bf16 CNN runs are no reference.
CONV_PROBE_BOUND = 1e-2


def mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def gpt():
    return GPT(512, 64, 2, 4, 64)


def vgg():
    layers, c = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            layers.append(torch.nn.MaxPool2d(2, 2))
        else:
            layers += [torch.nn.Conv2d(c, v // 8, 3, 1, 1), torch.nn.ReLU()]
            c = v // 8
    layers += [torch.nn.AdaptiveAvgPool2d((7, 7)), torch.nn.Flatten(), torch.nn.Linear(c * 49, 512), torch.nn.ReLU(),
               torch.nn.Dropout(0.0), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Dropout(0.0),
               torch.nn.Linear(512, 10)]
    return torch.nn.Sequential(*layers)


def resnet():
    return torchvision.models.resnet18(num_classes=10)


def conv_probe_error():
    """|autocast conv - round(conv of the rounded inputs in float32)| / |the latter|, on one layer."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, 16, 16, generator=g), torch.randn(64, 64, 3, 3, generator=g) * 0.05
    ref = F.conv2d(x.bfloat16().float(), w.bfloat16().float(), padding=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.conv2d(x, w, padding=1)
    return float((y.float() - ref).norm() / ref.norm())


def state(model):
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def train(make, init, x, y, bf16):
    model = make()
    model.load_state_dict(init, strict=False)  # the GPT's lm_head is wte
    is_gpt = isinstance(model, GPT)
    lr = {mlp: 0.05, vgg: 0.05, resnet: 0.0003}.get(make)
    opt = adamw(model, 1e-3, 0.1) if is_gpt else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        if is_gpt:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
    out = state(model)
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    probe = torch.tensor([conv_probe_error()], dtype=torch.float32)
    for name, make in (("mlp", mlp), ("gpt", gpt), ("vgg", vgg), ("resnet", resnet)):
        torch.manual_seed(0)
        init = state(make())
        if name == "mlp":
            x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
        elif name == "gpt":
            x, y = torch.randint(0, 512, (4, 32)), torch.randint(0, 512, (4, 32))
        else:
            x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
        save_file({**init, "x": x, "y": y, "conv_probe_error": probe}, os.path.join(out_dir, f"{name}_init.safetensors"))
        for tag, bf16 in (("fp32", False), ("bf16", True)):
            path = os.path.join(out_dir, f"{name}_{tag}.safetensors")
            if bf16 and name in ("vgg", "resnet") and float(probe[0]) > CONV_PROBE_BOUND:
                if os.path.exists(path):
                    os.remove(path)  # a reference from another run is not this CPU's
                continue
            save_file(train(make, init, x, y, bf16), path)
    print(f"precision_torch.py: wrote {out_dir} (torch {torch.__version__}; bf16 convolution's probe error "
          f"{float(probe[0]):.2e})")


if __name__ == "__main__":
    main()
