#!/usr/bin/env python3
"""Reference files for tests/test_gpt_hf.cpp: a tiny GPT-2 made and saved by Hugging Face's
transformers itself (GPT2LMHeadModel, random weights; nothing is downloaded), in the layouts a
user meets:

  lm/    save_pretrained of GPT2LMHeadModel: config.json, model.safetensors with "transformer."
         names, Conv1D weights (in, out), lm_head left out (tied)
  base/  save_pretrained of GPT2Model (the hub's "gpt2" layout): names without the prefix
  hub/   base/'s tensors plus the causal-mask buffers "h.N.attn.bias" (1, 1, T, T) and
         "h.N.attn.masked_bias" that older checkpoints (the hub's gpt2 file) carry, and lm_head.weight
         written out equal to wte
  ref.safetensors  tokens (3, 40) int64 and transformers' logits (3, 40, 512) in eval mode

Config: vocab 512, context 64, 2 layers, 4 heads, width 64 (gelu_new, layer_norm_epsilon 1e-5).

With MG_GPT2_DIR set to a folder of a GPT-2 the user has (the hub's gpt2: config.json and
model.safetensors; nothing is downloaded), also
  pretrained.safetensors  tokens (2, 64) and transformers' logits for them from that folder

    /usr/bin/python3 tests/reference/gpt2_hf.py OUT_DIR
    MG_GPT2_DIR=models/gpt2 ctest -R test_gpt_hf      # the test compares ours on that folder too

Exit status 77 (ctest's skip) when torch, safetensors or transformers cannot be imported.
"""
import inspect
import os
import shutil
import sys

try:
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:
    print(f"gpt2_hf.py: cannot import {e.name}; install python3-torch and the safetensors and transformers "
          "packages (scripts/setup.sh does)")
    sys.exit(77)

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 512, 64, 2, 4, 64


def save_safetensors(model, path):
    # transformers 5 always writes safetensors and no longer takes the switch.
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        model.save_pretrained(path, safe_serialization=True)
    else:
        model.save_pretrained(path)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH)
    model = GPT2LMHeadModel(config).eval()
    save_safetensors(model, os.path.join(out, "lm"))
    save_safetensors(model.transformer, os.path.join(out, "base"))

    hub = os.path.join(out, "hub")
    os.makedirs(hub, exist_ok=True)
    shutil.copy(os.path.join(out, "base", "config.json"), hub)
    tensors = {k: v.detach().clone().contiguous() for k, v in model.transformer.state_dict().items()}
    mask = torch.tril(torch.ones(CONTEXT, CONTEXT)).view(1, 1, CONTEXT, CONTEXT)
    for i in range(LAYERS):
        tensors[f"h.{i}.attn.bias"] = mask.clone()
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    tensors["lm_head.weight"] = model.lm_head.weight.detach().clone()
    save_file(tensors, os.path.join(hub, "model.safetensors"), metadata={"format": "pt"})

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (3, 40), generator=g)
    with torch.no_grad():
        logits = model(tokens).logits
    save_file({"tokens": tokens, "logits": logits.contiguous()}, os.path.join(out, "ref.safetensors"))
    print(f"gpt2_hf.py: wrote {out}/lm, base, hub and ref.safetensors")

    folder = os.environ.get("MG_GPT2_DIR")
    if folder:
        big = GPT2LMHeadModel.from_pretrained(folder, local_files_only=True).eval()
        g = torch.Generator().manual_seed(2)
        tokens = torch.randint(0, big.config.vocab_size, (2, 64), generator=g)
        with torch.no_grad():
            logits = big(tokens).logits
        save_file({"tokens": tokens, "logits": logits.contiguous()}, os.path.join(out, "pretrained.safetensors"))
        print(f"gpt2_hf.py: wrote {out}/pretrained.safetensors from {folder}")


if __name__ == "__main__":
    main()
