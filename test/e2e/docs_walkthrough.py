#!/usr/bin/python3
"""Runs the commands of a docs page as a new user would: the first ```sh block under the given
heading, as one bash script (set -euo pipefail), from a fresh folder laid out like the repository
root (scripts/ and configs/ of the source, build/bin of this build; everything the commands
write stays in the folder). Fails with the output when a command fails or the block takes more
than --timeout seconds.

With --needs-slurm, a machine where scripts/slurm-local.sh cannot start a cluster skips (77).

usage: docs_walkthrough.py --source SRC --bin BUILD/bin --workdir DIR --page docs/slurm.md
                           --heading "## Try it on this machine" [--needs-slurm] [--expect TEXT ...]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys


def block(page, heading):
    text = open(page).read()
    if heading not in text:
        sys.exit(f"{page}: no heading {heading!r}")
    m = re.search(r"```sh\n(.*?)```", text.split(heading, 1)[1], re.S)
    if not m:
        sys.exit(f"{page}: no ```sh block under {heading!r}")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--page", required=True)
    ap.add_argument("--heading", required=True)
    ap.add_argument("--needs-slurm", action="store_true")
    ap.add_argument("--expect", nargs="*", default=[], help="text the output must contain")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if args.needs_slurm:
        check = subprocess.run(["bash", os.path.join(args.source, "scripts", "slurm-local.sh"), "check"],
                               capture_output=True, text=True)
        if check.returncode != 0:
            print(check.stdout + check.stderr + "skipped: no Slurm cluster can run here")
            return 77
    script = block(os.path.join(args.source, args.page), args.heading)
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(os.path.join(args.workdir, "build"))
    for folder in ("scripts", "configs", "docs"):
        os.symlink(os.path.join(os.path.abspath(args.source), folder), os.path.join(args.workdir, folder))
    os.symlink(os.path.abspath(args.bin), os.path.join(args.workdir, "build", "bin"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print(script)
    try:
        r = subprocess.run(["bash", "-c", "set -euo pipefail -x\n" + script], cwd=args.workdir, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        print(e.stdout or "")
        print(f"{args.page}: the commands did not finish in {args.timeout:.0f} s")
        cleanup(args)
        return 1
    print(r.stdout[-12000:])
    cleanup(args)
    if r.returncode != 0:
        print(f"{args.page}: a command exited with status {r.returncode}")
        return 1
    missing = [t for t in args.expect if t not in r.stdout]
    if missing:
        print(f"{args.page}: the output lacks {missing}")
        return 1
    print(f"{args.page}: every command of {args.heading!r} ran")
    return 0


def cleanup(args):
    # A cluster the page started and did not stop (a command failed first).
    cluster = os.path.join(args.workdir, "build", "slurm-local")
    if os.path.isdir(cluster):
        subprocess.run(["bash", os.path.join(args.source, "scripts", "slurm-local.sh"), "stop", cluster],
                       capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
