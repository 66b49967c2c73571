#!/usr/bin/env python3
"""A stand-in for llm.c's train_gpt2cu (tests/peer_scripts.py): takes its flags, prints what it
prints in the form its source prints it (../shared/peers/llm.c/train_gpt2.cu: the allocation
lines, 'device memory usage: U MiB / T MiB', the bf16 step lines), with made-up sizes linear in
the batch, so that the scripts that run llm.c (bench/gpt_peers.py, bench/memory_record.py) can be
tried without a GPU. Like llm.c, it falls back to cudaMallocManaged (and says so) rather than fail
when the batch does not fit the device; the device has LLMC_STAND_IN_TOTAL_MIB (default 8000) MiB.

Sizes: LLMC_STAND_IN_FIXED_MIB (default 2000) MiB fixed, and 100, 70, 50 MiB a sequence of 1024
tokens at -r 0, 1, 2 (at least 1 MiB)."""
import sys


def main():
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    b, t, steps, r = int(args["-b"]), int(args["-t"]), int(args["-x"]), int(args.get("-r", "1"))
    import os
    total = int(os.environ.get("LLMC_STAND_IN_TOTAL_MIB", "8000"))
    fixed = int(os.environ.get("LLMC_STAND_IN_FIXED_MIB", "2000"))
    per_seq = max(1, {0: 100, 1: 70, 2: 50}[r] * t // 1024)
    acts = per_seq * b
    print("Multi-GPU support is disabled. Using a single GPU.")
    print(f"| micro batch size B    | {b:<50} |")
    print(f"| sequence length T     | {t:<50} |")
    print(f"| recompute             | {r:<50} |")
    print("allocated 237 MiB for model parameters")
    print(f"allocating {acts} MiB for activations")
    used = fixed + acts
    if used > total:
        print("WARNING: Fell back to cudaMallocManaged when initializing m,v,master_weights on 1 GPUs")
        print("         Prevents an OOM, but code may run much slower due to device <-> host memory movement")
        used = total
    print(f"device memory usage: {used} MiB / {total} MiB")
    print(f"memory per sequence: {per_seq} MiB")
    print(f" -> estimated maximum batch size: {b + (total - used) // max(per_seq, 1)}")
    ms = 1.0 + 0.5 * b
    for s in range(1, steps + 1):
        print(f"step {s:4d}/{steps} | loss {11.0 - 0.01 * s:7.6f} (+0.00z)| norm 1.0000 (+0.00z)| lr 3.00e-04 | "
              f"{ms:.2f} ms | -100.0% bf16 MFU | {b * t / ms * 1000:.0f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
