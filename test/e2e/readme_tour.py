#!/usr/bin/env python3
"""Runs every command of the README's "A short tour" as a new user would, in order, in a fresh
work directory, and fails on the first that exits non-zero. Benchmarks (bench/) and the GPU
commands (--device cuda) are left to their own checks; `some-text.txt` is a Debian licence text,
and `scripts/` and `configs/` are the repository's."""
import argparse
import os
import re
import shutil
import subprocess
import sys


def tour_commands(readme):
    text = open(readme).read()
    section = text.split("## A short tour", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands, current = [], ""
    for line in block.splitlines():
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                commands.append(current.strip())
            current = ""
    return commands


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--readme", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    shutil.copy("/usr/share/common-licenses/GPL-3", os.path.join(args.workdir, "some-text.txt"))
    # The tour runs from the repository root: its scripts/, configs/ and test/ (the example
    # PyTorch modules) are there.
    for folder in ("scripts", "configs", "test"):
        os.symlink(os.path.join(os.path.dirname(os.path.abspath(args.readme)), folder),
                   os.path.join(args.workdir, folder))
    env = dict(os.environ, B=os.path.abspath(args.bin), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    ran = 0
    for cmd in tour_commands(args.readme):
        if cmd.startswith("B=") or "--device cuda" in cmd or "bench/" in cmd.split("#")[0]:
            continue
        print("$", cmd, flush=True)
        r = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=args.workdir, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            print(r.stdout[-4000:])
            print(f"readme tour: this command exited with status {r.returncode}")
            return 1
        ran += 1
    print(f"readme tour: {ran} commands ran")
    return 0 if ran >= 15 else 1


if __name__ == "__main__":
    sys.exit(main())
