#!/usr/bin/env python3
"""Cross-checks a safetensors file written by libminigrad against what the writer meant.

Readers used:
  1. an independent parser written from the format description (json + numpy; no safetensors
     package): 8-byte little-endian header length N, N bytes of JSON, then the byte buffer that
     the tensors' data_offsets must tile exactly;
  2. safetensors.torch.load_file, when `import safetensors.torch` works;
  3. when torch imports and the sidecar names an MLP (mlp_sizes), the tensors are loaded with
     load_state_dict(strict=True) into the torch.nn.Sequential that make_mlp mirrors, which
     checks that our parameter names are PyTorch's.

The expectation comes from a sidecar JSON (--expect FILE):
  {"tensors": {"1.weight": {"dtype": "F32", "shape": [3, 5], "values": [...]}, ...},
   "metadata": {"epoch": "3"}, "mlp_sizes": [784, 32, 10]}
Values are compared exactly (the file holds float32/int64 bits; the sidecar prints floats with
9 significant digits, which round-trips float32).

    /usr/bin/python3 bench/reference/check_safetensors.py model.safetensors --expect model.json

Exit status: 0 all readers agree with the sidecar, 1 a mismatch (printed), 2 bad usage.
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32,
          "F16": np.float16, "U8": np.uint8, "BF16": None}


def parse(path):
    """Returns (tensors {name: np.ndarray}, metadata, names in data order); raises ValueError."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the header length field")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file ({len(data)} bytes)")
    raw = data[8:8 + n]
    if not raw.startswith(b"{"):
        raise ValueError(f"{path}: header does not start with '{{'")

    def no_dupes(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError(f"{path}: duplicate keys in the header")
        return dict(pairs)

    header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_dupes)
    buf = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    pos = 0
    tensors = {}
    for name, info in entries:
        begin, end = info["data_offsets"]
        if begin != pos:
            raise ValueError(f"{path}: tensor {name} starts at {begin}, expected {pos} (hole/overlap)")
        dtype = DTYPES.get(info["dtype"], "unknown")
        if dtype == "unknown":
            raise ValueError(f"{path}: tensor {name} has unknown dtype {info['dtype']}")
        shape = tuple(info["shape"])
        itemsize = 2 if dtype is None else np.dtype(dtype).itemsize
        if end - begin != int(np.prod(shape, dtype=np.int64)) * itemsize:
            raise ValueError(f"{path}: tensor {name}: {end - begin} bytes for shape {shape} {info['dtype']}")
        chunk = buf[begin:end]
        if dtype is None:  # bfloat16: the upper half of a float32
            arr = (np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<"))
        tensors[name] = (info["dtype"], arr.reshape(shape))
        pos = end
    if pos != len(buf):
        raise ValueError(f"{path}: tensors cover {pos} of {len(buf)} buffer bytes")
    return tensors, metadata, [name for name, _ in entries]


def compare(reader, got, expect, problems):
    """got: {name: (dtype str, np array)}."""
    want = expect.get("tensors", {})
    if set(got) != set(want):
        problems.append(f"{reader}: names {sorted(got)} != expected {sorted(want)}")
    for name, spec in want.items():
        if name not in got:
            continue
        dtype, arr = got[name]
        if dtype != spec["dtype"]:
            problems.append(f"{reader}: {name} dtype {dtype} != {spec['dtype']}")
        if list(arr.shape) != list(spec["shape"]):
            problems.append(f"{reader}: {name} shape {list(arr.shape)} != {spec['shape']}")
            continue
        if "values" in spec:
            ref = np.asarray(spec["values"], dtype=np.float64).reshape(spec["shape"])
            if dtype == "F32":
                ref = ref.astype(np.float32)
            elif dtype == "I64":
                ref = np.asarray(spec["values"], dtype=np.int64).reshape(spec["shape"])
            bad = np.count_nonzero(np.asarray(arr) != ref)
            if bad:
                problems.append(f"{reader}: {name}: {bad} of {ref.size} values differ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--expect", required=True, help="sidecar JSON with the expected tensors")
    ap.add_argument("--no-torch", action="store_true", help="run the spec parser only (fast)")
    args = ap.parse_args()
    with open(args.expect) as f:
        expect = json.load(f)
    problems = []

    tensors, metadata, order = parse(args.file)
    print(f"spec parser (json + numpy): {len(tensors)} tensors")
    for name in order:
        print(f"  {name:<16} {tensors[name][0]:<5} {list(tensors[name][1].shape)}")
    compare("spec parser", tensors, expect, problems)
    if metadata != expect.get("metadata", {}):
        problems.append(f"spec parser: metadata {metadata} != {expect.get('metadata', {})}")
    if "order" in expect and order != expect["order"]:
        problems.append(f"spec parser: data order {order} != {expect['order']}")

    torch = safetensors = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("torch: not installed; skipping the torch checks")
        try:
            import safetensors
            import safetensors.torch
        except ImportError:
            safetensors = None
            print("safetensors (with torch): not installed; skipping safetensors.torch.load_file")
    if torch is not None and safetensors is not None:
        loaded = safetensors.torch.load_file(args.file)
        names = {torch.float32: "F32", torch.int64: "I64", torch.bfloat16: "BF16"}
        got = {k: (names.get(v.dtype, str(v.dtype)), v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy())
               for k, v in loaded.items()}
        print(f"safetensors {safetensors.__version__} load_file: {len(got)} tensors")
        compare("safetensors.torch.load_file", got, expect, problems)
        with safetensors.safe_open(args.file, framework="pt") as f:
            if (f.metadata() or {}) != expect.get("metadata", {}):
                problems.append(f"safe_open: metadata {f.metadata()} != {expect.get('metadata', {})}")

    if torch is not None and "mlp_sizes" in expect:
        sizes = expect["mlp_sizes"]
        layers = [torch.nn.Flatten()]
        for i in range(len(sizes) - 1):
            layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*layers)
        state = {k: torch.from_numpy(np.array(v[1])) for k, v in tensors.items()}
        try:
            model.load_state_dict(state, strict=True)
            print(f"torch.nn.Sequential MLP {sizes}: load_state_dict(strict=True) ok")
        except RuntimeError as e:
            problems.append(f"torch load_state_dict: {e}")

    for p in problems:
        print("MISMATCH:", p)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
