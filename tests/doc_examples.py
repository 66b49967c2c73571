#!/usr/bin/env python3
"""The C++ examples of the docs and of the public headers, compiled as they are written.

Two commands, one reading of the examples:

  docs      (ctest `doc_examples`) every ```cpp block of README.md and docs/*.md, compiled with
            -fsyntax-only against the installed package (installed from BUILD into a temporary
            prefix, as tests/package_test.sh does; only -I<prefix>/include on the path).
  headers   (a build step of test_header_examples) the usage example at the top of every public
            header, include/minigrad/**.h, written into OUT/<header>.inc for
            tests/test_header_examples.cpp to include inside its test cases.

A markdown block is C++ when its fence says so (```cpp); every fence must name its language, so
C++ cannot hide in an untagged block: output, listings and pseudo-code are ```text, commands
```sh. A block with `int main` is a whole program and compiles alone. Any other block is a
fragment: its #include lines go to the top of the file, after <minigrad/minigrad.h>, and the rest
becomes the body of a function whose parameters are the block's context: what it uses but does
not declare, stated in an HTML comment right above the fence (markdown does not show it),

    <!-- context: mg::nn::Sequential& model; mg::Tensor x; int64_t epoch -->
    ```cpp
    mg::Tensor y = model.forward(x);
    ```

one declaration of one name per `;`. Errors name the doc's own file and line (#line).

A header's usage example is the first paragraph of its opening comment whose lines are all
indented by three spaces or more (`//   ...`); a header without one has no .inc. The test must
include every .inc there is (`#include "core/memory.h.inc"`), so a new header's example cannot
go untested: `headers --used-by tests/test_header_examples.cpp` fails otherwise.

    python3 tests/doc_examples.py docs ROOT BUILD [--cxx c++]
    python3 tests/doc_examples.py headers ROOT OUT --used-by FILE
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^(\s*)```(.*)$")
CONTEXT = re.compile(r"<!--\s*context:(.*?)-->", re.S)
CPP = ("cpp", "c++")


def doc_files(root):
    yield root / "README.md"
    yield from sorted((root / "docs").glob("*.md"))


def markdown_blocks(path, name, problems):
    """(language, first line of the body (1-based), body lines, context declarations) per block;
    a fence without a language, or one never closed, is added to `problems`."""
    lines = path.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).strip()
        if not lang:
            problems.append(f"{name}:{i + 1}: a fence without a language: ```cpp for C++ that "
                            "compiles, ```text for output or pseudo-code, ```sh for commands")
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            problems.append(f"{name}:{i + 1}: a ```{lang} block that is never closed")
            break
        body = [l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:j]]
        context = []
        k = i - 1
        if k >= 0 and lines[k].rstrip().endswith("-->"):  # an HTML comment ending right above
            while k > 0 and "<!--" not in lines[k]:
                k -= 1
            c = CONTEXT.search("\n".join(lines[k:i]))
            if c:
                context = [d.strip() for d in c.group(1).split(";") if d.strip()]
        blocks.append(((lang.split() or [""])[0].lower(), i + 2, body, context))
        i = j + 1
    return blocks


def header_example(path):
    """(first line (1-based), lines) of the usage example at the top of a header, or None."""
    head = []
    for line in path.read_text().split("\n"):
        if not line.startswith("//"):
            break
        head.append(line[2:])
    para, start = [], None
    for n, text in enumerate(head + [""]):
        if text.strip():
            if start is None:
                start = n
            para.append(text)
            continue
        if para and all(t.startswith("   ") for t in para):
            return start + 1, [t[3:] for t in para]
        para, start = [], None
    return None


def cmd_headers(args):
    root, out = pathlib.Path(args.root), pathlib.Path(args.out)
    used = set(re.findall(r'^\s*#\s*include\s+"([\w/.]+\.h)\.inc"', pathlib.Path(args.used_by).read_text(), re.M))
    found, problems = set(), []
    for h in sorted((root / "include/minigrad").rglob("*.h")):
        rel = h.relative_to(root / "include/minigrad").as_posix()
        ex = header_example(h)
        inc = out / (rel + ".inc")
        inc.parent.mkdir(parents=True, exist_ok=True)
        if ex is None:
            text = f'#error "include/minigrad/{rel} has no usage example at the top"\n'
        else:
            found.add(rel)
            first, body = ex
            text = f'#line {first} "include/minigrad/{rel}"\n' + "\n".join(body) + "\n"
        inc.write_text(text)
    for rel in sorted(found - used):
        problems.append(f"include/minigrad/{rel}: its usage example is not included by {args.used_by}")
    for rel in sorted(used - found):
        problems.append(f"{args.used_by} includes {rel}.inc, but include/minigrad/{rel} has no usage example")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


def translation_units(root, problems):
    """(name, source) per file to compile: one for all fragments, one per whole program."""
    heads, funcs, programs, spans = [], [], [], []
    for doc in doc_files(root):
        rel = doc.relative_to(root).as_posix()
        for lang, first, body, context in markdown_blocks(doc, rel, problems):
            if lang not in CPP:
                continue
            if any(re.search(r"\bint\s+main\s*\(", l) for l in body):
                spans.append((rel, first, first + len(body) - 1))
                programs.append((f"{rel}:{first}", f'#line {first} "{rel}"\n' + "\n".join(body) + "\n"))
                continue
            for n, l in enumerate(body):
                if l.lstrip().startswith("#include"):
                    heads.append(f'#line {first + n} "{rel}"\n{l}')
            code = ["" if l.lstrip().startswith("#include") else l for l in body]
            spans.append((rel, first, first + len(body) - 1))
            funcs.append(f'#line {first - 2} "{rel}"\n'
                         f"[[maybe_unused]] static void doc_example_{len(funcs)}({', '.join(context)}) {{\n"
                         f'#line {first} "{rel}"\n' + "\n".join(code) + "\n}\n")
    fragments = "#include <minigrad/minigrad.h>\n" + "\n".join(heads) + "\n\n" + "\n".join(funcs)
    return [("fragments", fragments)] + programs, len(funcs), spans


def cmd_docs(args):
    root = pathlib.Path(args.root)
    problems = []
    units, n_fragments, spans = translation_units(root, problems)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        prefix = pathlib.Path(tmp) / "prefix"
        subprocess.run(["cmake", "--install", args.build, "--prefix", str(prefix)], check=True,
                       stdout=subprocess.DEVNULL)
        failed, errors = [], []
        for i, (name, source) in enumerate(units):
            src = pathlib.Path(tmp) / f"unit{i}.cpp"
            src.write_text(source)
            r = subprocess.run([args.cxx, "-std=c++20", "-fsyntax-only", f"-I{prefix}/include", str(src)],
                               capture_output=True, text=True, cwd=root)
            if r.returncode != 0:
                failed.append(name)
                sys.stderr.write(r.stderr)
                errors += re.findall(r"^([^\s:]+\.md):(\d+):(?:\d+:)? (?:fatal )?error", r.stderr, re.M)
    if failed:
        blocks = sorted({f"{rel}:{a - 1}" for rel, a, b in spans for f, n in errors if f == rel and a - 2 <= int(n) <= b})
        print(f"doc examples that do not compile against the installed package: {', '.join(blocks or failed)} "
              "(a fragment's undeclared names go in a <!-- context: ... --> comment above its fence; "
              "tests/doc_examples.py)", file=sys.stderr)
        return 1
    print(f"doc examples: {n_fragments} fragments and {len(units) - 1} programs compile against the installed package")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("docs")
    d.add_argument("root")
    d.add_argument("build")
    d.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    h = sub.add_parser("headers")
    h.add_argument("root")
    h.add_argument("out")
    h.add_argument("--used-by", required=True)
    args = p.parse_args()
    return cmd_docs(args) if args.cmd == "docs" else cmd_headers(args)


if __name__ == "__main__":
    sys.exit(main())
