#!/usr/bin/env bash
# Builds bench/gemm_choice/gemm_choice.cpp against Eigen, OpenBLAS (pthread build, run with one
# thread) and BLIS (run with one thread) and prints GFLOP/s per shape for each.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/gemm_choice
mkdir -p "$out"
lib=/usr/lib/x86_64-linux-gnu
g++ -O3 -march=native -I/usr/include/eigen3 "$here/gemm_choice.cpp" -o "$out/oblas" \
  -L$lib/openblas-pthread -lopenblas -Wl,-rpath,$lib/openblas-pthread
g++ -O3 -march=native -I/usr/include/eigen3 "$here/gemm_choice.cpp" -o "$out/blis" \
  -L$lib/blis-openmp -lblis -Wl,-rpath,$lib/blis-openmp -fopenmp
OPENBLAS_NUM_THREADS=1 "$out/oblas" eigen
OPENBLAS_NUM_THREADS=1 "$out/oblas" oblas
BLIS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$out/blis" blis
