#!/usr/bin/python3
"""PyTorch reference for apps/mnist_ga: the tutorials' recipes on the same data split.

Data: the MNIST test set in ../shared/data/mnist (t10k-*), first 8,000 images to train, last
2,000 held out, normalised (x/255 - 0.1307)/0.3081 -- the split and normalisation mnist_ga uses.
Model: nn.Sequential(Flatten, Linear(784,512), ReLU, Linear(512,512), ReLU, Linear(512,10)),
CrossEntropyLoss, SGD without momentum (the PyTorch "Optimizing Model Parameters" tutorial).

Recipes (as the accumulation tutorials write them: loss / N, step and zero_grad every N batches,
a final step for a leftover window):
  A: batch 64,          SGD lr 1e-3, 20 epochs
  B: batch 32 x 2 accum, SGD lr 1e-2,  3 epochs
Each for seeds 0, 1, 2; prints each held-out accuracy and the mean, and writes a JSON summary.

  /usr/bin/python3 bench/reference/mnist_ga_torch.py --json /tmp/torch_ref.json
  /usr/bin/python3 bench/reference/compare_mnist_ga.py --torch-json /tmp/torch_ref.json --bin build/bin/mnist_ga
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
from torch import nn

RECIPES = {
    "A": dict(batch=64, accum=1, lr=1e-3, epochs=20),
    "B": dict(batch=32, accum=2, lr=1e-2, epochs=3),
}


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(data_dir, n_train=8000):
    x = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    # Same float expression as IdxDataset::normalized_image (src/data/idx.cpp):
    # (x / 255 - mean) * (1 / std), in float32.
    xf = (x.astype(np.float32) / np.float32(255.0) - np.float32(0.1307)) * (np.float32(1.0) / np.float32(0.3081))
    xf = torch.from_numpy(xf).unsqueeze(1)
    y = torch.from_numpy(y)
    return (xf[:n_train], y[:n_train]), (xf[n_train:], y[n_train:])


def make_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y).item()
        acc = (logits.argmax(1) == y).float().mean().item() * 100
    model.train()
    return loss, acc


def run(recipe, seed, train, test):
    torch.manual_seed(seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=recipe["lr"], momentum=0.0)
    loss_fn = nn.CrossEntropyLoss()
    x, y = train
    n, b, N = len(y), recipe["batch"], recipe["accum"]
    gen = torch.Generator().manual_seed(seed)
    history = []
    for epoch in range(recipe["epochs"]):
        t0 = time.time()
        perm = torch.randperm(n, generator=gen)
        opt.zero_grad()
        pending = 0
        for i, start in enumerate(range(0, n, b)):
            idx = perm[start:start + b]
            loss = loss_fn(model(x[idx]), y[idx]) / N
            loss.backward()
            pending += 1
            if pending == N:
                opt.step()
                opt.zero_grad()
                pending = 0
        if pending:
            opt.step()
            opt.zero_grad()
        tl, ta = evaluate(model, *test)
        history.append(dict(epoch=epoch + 1, test_loss=tl, test_accuracy=ta, seconds=time.time() - t0))
    return history


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.normpath(os.path.join(here, "../../../shared/data/mnist")))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--recipes", default="A,B")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train, test = load_split(args.data)
    print(f"torch {torch.__version__}; data {args.data}: {len(train[1])} train, {len(test[1])} held out")
    out = {"torch": torch.__version__, "data": args.data, "recipes": {}}
    for name in args.recipes.split(","):
        r = RECIPES[name]
        accs = []
        runs = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            t0 = time.time()
            h = run(r, seed, train, test)
            accs.append(h[-1]["test_accuracy"])
            runs.append(dict(seed=seed, history=h))
            print(f"recipe {name} {r}: seed {seed}: held-out accuracy {accs[-1]:.2f}% "
                  f"(loss {h[-1]['test_loss']:.4f}, {time.time() - t0:.0f} s)", flush=True)
        mean = float(np.mean(accs))
        print(f"recipe {name}: mean held-out accuracy over {len(accs)} seeds: {mean:.2f}% (std {np.std(accs):.2f})")
        out["recipes"][name] = dict(recipe=r, accuracies=accs, mean_accuracy=mean, runs=runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
