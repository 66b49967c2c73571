#!/usr/bin/env bash
# The installed package as a user meets it (ctest: package_link_demo). Follows the README's
# "Using the library from C++" lines exactly: install, configure examples/link_demo with
# -DCMAKE_PREFIX_PATH, build, run. Then checks that
#   - the README shows examples/link_demo's CMakeLists.txt and main.cpp verbatim (they cannot drift);
#   - minigrad::minigrad puts only the package's own include directory on a user's path;
#   - every installed header compiles on its own with that one include path (no Eigen, no CUDA).
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$src/examples/link_demo" -B "$tmp/build-demo" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/build-demo" >/dev/null
(cd "$tmp" && ./build-demo/link_demo)

python3 - "$src" <<'PY'
import sys, pathlib
root = pathlib.Path(sys.argv[1])
readme = (root / "README.md").read_text()
for name in ("CMakeLists.txt", "main.cpp"):
    text = (root / "examples/link_demo" / name).read_text().strip()
    if text not in readme:
        sys.exit(f"README.md does not show examples/link_demo/{name} verbatim")
PY

targets=$(find "$prefix" -name 'minigradTargets.cmake')
incs=$(grep -o 'INTERFACE_INCLUDE_DIRECTORIES "[^"]*"' "$targets")
if [ "$incs" != 'INTERFACE_INCLUDE_DIRECTORIES "${_IMPORT_PREFIX}/include"' ]; then
  echo "minigrad::minigrad exports include directories other than its own: $incs"; exit 1
fi

n=0
while IFS= read -r h; do
  echo "#include <${h#"$prefix/include/"}>" > "$tmp/one.cpp"
  c++ -std=c++20 -fsyntax-only -I"$prefix/include" "$tmp/one.cpp" || { echo "installed header $h does not compile on its own"; exit 1; }
  n=$((n + 1))
done < <(find "$prefix/include" -name '*.h' | sort)
echo "package: link_demo built and ran; $n installed headers compile with only -I<prefix>/include"
