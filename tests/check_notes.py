#!/usr/bin/env python3
"""Keeps the notes and the paths in comments and docs true (ctest `notes`).

A note is defined once, as a comment line `Note [name]` followed by a line of `~` (c10's form):

    // Note [fixed pieces]
    // ~~~~~~~~~~~~~~~~~~~
    // Work is cut into pieces ...

and referred to anywhere as `Note [name]` (or `Notes [a] and [b]`). The test fails on
  - a note referred to but defined nowhere, or defined twice;
  - a definition underlined with `-` instead of `~` (`Note [name]: ...` opening a comment is a
    reference that says more there);
  - a repository path (src/..., include/..., tests/..., docs/..., scripts/..., bench/..., apps/...,
    examples/..., fuzz/..., cmake/..., .ci/...) in a comment or a doc, outside a markdown code
    block (commands there name the files they write), that names no file or folder.

    python3 tests/check_notes.py REPOSITORY_ROOT
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CODE = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".py", ".sh", ".cmake", ".txt")
FOLDERS = ("src", "include", "apps", "tests", "bench", "scripts", "fuzz", "examples", "cmake", ".ci")
TOP_DIRS = ("src", "include", "tests", "docs", "scripts", "bench", "apps", "examples", "fuzz", "cmake", ".ci")

NOTE = re.compile(r"Notes? \[([^\]\n]+)\]((?:,? (?:and )?\[[^\]\n]+\])*)")
MORE = re.compile(r"\[([^\]\n]+)\]")
DEF_BLOCK = re.compile(r"^\s*(?://|#)?\s*Note \[([^\]]+)\]\s*$")
RULE = re.compile(r"^\s*(?://|#)?\s*(~{3,}|-{3,})\s*$")
# A path: one of the top folders, then name characters and slashes, ending in a name.
PATH = re.compile(r"(?<![\w./$<{-])((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w.+-]+(?:/[\w.+-]+)*)")


def files():
    for top in FOLDERS:
        for dirpath, dirnames, names in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("results", "__pycache__", "corpus")]
            for n in names:
                if n.endswith(CODE) or n == "CMakeLists.txt":
                    yield os.path.join(dirpath, n)
    for dirpath, _, names in os.walk(os.path.join(ROOT, "docs")):
        for n in names:
            if n.endswith(".md"):
                yield os.path.join(dirpath, n)
    for n in ("README.md", "BENCHMARKS.md", "CMakeLists.txt"):
        if os.path.exists(os.path.join(ROOT, n)):
            yield os.path.join(ROOT, n)


def comment_text(path, line):
    """The part of a line a reader reads as prose: comments in code, everything in a doc."""
    if path.endswith(".md") or path.endswith(".txt"):
        return line
    if path.endswith((".py", ".sh", ".cmake")) or os.path.basename(path) == "CMakeLists.txt":
        i = line.find("#")
        return line[i:] if i >= 0 else ""
    i = line.find("//")
    return line[i:] if i >= 0 else ""


def main():
    defined = {}
    refs = {}
    errors = []
    for path in sorted(files()):
        rel = os.path.relpath(path, ROOT)
        if rel == "tests/check_notes.py":
            continue
        try:
            lines = open(path, encoding="utf-8").read().split("\n")
        except UnicodeDecodeError:
            continue
        fenced = False  # inside a markdown code block: commands, whose paths may be what they write
        for i, line in enumerate(lines):
            where = f"{rel}:{i + 1}"
            if path.endswith(".md") and line.lstrip().startswith("```"):
                fenced = not fenced
            m = DEF_BLOCK.match(line)
            if m and i + 1 < len(lines) and RULE.match(lines[i + 1]):
                name = m.group(1)
                if "~" not in lines[i + 1]:
                    errors.append(f"{where}: Note [{name}] is underlined with '-': use '~' (one form for every note)")
                if name in defined:
                    errors.append(f"{where}: Note [{name}] is defined again (first at {defined[name]})")
                else:
                    defined[name] = where
                continue
            text = comment_text(path, line)
            for m in NOTE.finditer(text):
                names = [m.group(1)] + MORE.findall(m.group(2) or "")
                for name in names:
                    refs.setdefault(name, where)
            for m in PATH.finditer("" if fenced else text):
                p = m.group(1).rstrip(".,:;)")
                after = text[m.end():m.end() + 1]
                if after in ("<", "*", "{", "$") or p.endswith(("/", "_", "-")):
                    continue  # a pattern (tests/test_<area>.cpp, bench/results/gpu-*), not a path
                if not os.path.exists(os.path.join(ROOT, p)):
                    errors.append(f"{where}: the path {p} names nothing in the repository")
    for name, where in sorted(refs.items()):
        if name not in defined:
            errors.append(f"{where}: Note [{name}] is referred to but defined nowhere")
    for e in errors:
        print("notes:", e)
    print(f"notes: {len(defined)} notes defined, {len(refs)} referred to, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
