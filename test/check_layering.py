#!/usr/bin/python3
"""The "depends on" column of docs/architecture.md's layer table, enforced: every
`#include "..."` of the project's sources must name a header of the file's own folder or of a
folder its row lists. A row's project folders are read from its cell: `dialects/`, `passes/memory`,
`runtime/schedule`, `kernels/common`, ... (in a `runtime/...` row, `plan/`, `exec/`, `device/`,
`comm/`, `io/` are that layer's siblings); "the layers" allows every layer, "nothing" none.
External libraries in the cell (MLIR, MPI, oneDNN, ...) are not checked here.

usage: check_layering.py SOURCE_DIR      (exit 1 with one line per include the table does not allow)
"""
import os
import re
import sys

LAYERS = ("dialects", "passes", "models", "planner", "runtime", "kernels", "tools")
RUNTIME_SIBLINGS = ("base", "plan", "schedule", "exec", "device", "comm", "io", "session")


def table(doc):
    text = open(doc).read().split("## Layers", 1)[1]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        folders = re.findall(r"`([^`]+)`", cells[0])
        for folder in folders:
            rows[folder.rstrip("/")] = cells[2]
    return rows


def allowed(folder, cell):
    """The project folders (prefixes) `folder` may include from, per its cell."""
    if "the layers" in cell or "everything" in cell:
        return list(LAYERS)
    out = []
    for m in re.finditer(r"\b(dialects|passes|models|planner|runtime|kernels|tools)(/[A-Za-z_\-]+)?", cell):
        out.append(m.group(1) + (m.group(2) or ""))
    if folder.startswith("runtime/"):
        out.append("runtime/base")  # the table's note: every runtime folder uses it
        for sibling in RUNTIME_SIBLINGS:
            if re.search(rf"(?<![/\w]){sibling}/", cell):
                out.append("runtime/" + sibling)
    if folder == "passes/Pipelines.cpp" and re.search(r"\bpasses\b", cell):
        out.append("passes")
    return out


def main():
    src = sys.argv[1]
    rows = table(os.path.join(src, "docs", "architecture.md"))
    keys = sorted((k for k in rows if k.split("/")[0] in LAYERS), key=len, reverse=True)

    def owner(path):
        """The table row a file or header path belongs to (the longest folder prefix)."""
        for k in keys:
            if path == k or path.startswith(k + "/"):
                return k
        top = path.split("/")[0]
        return top if top in rows else None

    problems, checked = [], 0
    for top in LAYERS:
        for root, _, files in os.walk(os.path.join(src, top)):
            for name in files:
                if not name.endswith((".h", ".cuh", ".cc", ".cpp", ".cu", ".def")):
                    continue
                rel = os.path.relpath(os.path.join(root, name), src)
                row = owner(rel)
                if row is None:
                    continue
                allow = allowed(row, rows[row])
                for n, line in enumerate(open(os.path.join(src, rel), errors="replace"), 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m or m.group(1).split("/")[0] not in LAYERS:
                        continue
                    checked += 1
                    target = m.group(1)
                    to = owner(target) or target.split("/")[0]
                    if to == row or to.startswith(row + "/") or row.startswith(to + "/"):
                        continue
                    if any(to == a or to.startswith(a + "/") or target.startswith(a + "/") for a in allow):
                        continue
                    problems.append(f"{rel}:{n}: includes {target} ({to}), but docs/architecture.md "
                                    f"says {row} depends on: {rows[row]}")
    for p in problems:
        print(p)
    print(f"check_layering: {checked} project includes in {len(keys)} folders; "
          f"{len(problems)} not allowed by docs/architecture.md")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
