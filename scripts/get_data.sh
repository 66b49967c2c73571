#!/usr/bin/env bash
# Downloads MNIST and FashionMNIST (the four standard IDX files each) where the internet is
# reachable; otherwise says where to put the files and what mnist_ga does without them.
#
#   scripts/get_data.sh [DEST [SETS]]  # default DEST: ${XDG_CACHE_HOME:-~/.cache}/minigrad-data,
#                                      # SETS: "mnist fashion" (scripts/run_main.sh asks for mnist)
#   build/bin/mnist_ga --data DEST/mnist ...
#   build/bin/mnist_ga --data DEST/fashion --dataset fashion ...
#
# Exit status: 0 when every file is present afterwards, 2 when some could not be downloaded.
set -u

dest="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/minigrad-data}"
files="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"
mirrors_mnist="https://ossci-datasets.s3.amazonaws.com/mnist https://storage.googleapis.com/cvdf-datasets/mnist"
mirrors_fashion="http://fashion-mnist.s3-website.eu-central-1.amazonaws.com"

fetch() {  # url out
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --connect-timeout 5 --max-time 120 -o "$2.part" "$1" && mv "$2.part" "$2"
  elif command -v wget >/dev/null 2>&1; then
    wget -q --timeout=5 -O "$2.part" "$1" && mv "$2.part" "$2"
  else
    echo "neither curl nor wget is installed" >&2
    return 1
  fi
}

missing=0
for set in ${2:-mnist fashion}; do
  mkdir -p "$dest/$set" 2>/dev/null || { echo "cannot create $dest/$set" >&2; exit 2; }
  mirrors=$mirrors_mnist
  [ "$set" = fashion ] && mirrors=$mirrors_fashion
  for f in $files; do
    out="$dest/$set/$f"
    if [ -s "$out" ]; then echo "have $out"; continue; fi
    ok=0
    for m in $mirrors; do
      if fetch "$m/$f" "$out" 2>/dev/null; then ok=1; echo "got  $out ($m)"; break; fi
      rm -f "$out.part"
    done
    if [ $ok = 0 ]; then missing=1; echo "FAILED $set/$f (no network or mirror down)"; fi
  done
done

if [ $missing = 1 ]; then
  cat <<EOF

Some files could not be downloaded (no internet here?). Put the standard files by hand into
  $dest/mnist/    and    $dest/fashion/
named train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,
t10k-labels-idx1-ubyte.gz (gzip or raw; raw files drop the .gz), from
  MNIST:        https://yann.lecun.com/exdb/mnist/ (or the mirrors above)
  FashionMNIST: https://github.com/zalandoresearch/fashion-mnist

Without them, mnist_ga still runs:
  - with ../shared/data/mnist (the 10k MNIST test set) when present: it trains on its first
    8,000 images and holds out the last 2,000 (scripts/make_mnist_split.py writes that split as
    the four standard files if you want them on disk);
  - otherwise on generated MNIST-like data, and it says so in its first line of output.
EOF
  exit 2
fi
echo "all files present in $dest"
