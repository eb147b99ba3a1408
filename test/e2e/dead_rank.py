#!/usr/bin/python3
"""No hang, ever: while a 2-rank data-parallel run trains, one rank is killed (or,
with --signal STOP, frozen); the job must end with a non-zero status and an error
naming the rank within a bounded time. A killed rank is reported by ptc-run itself (the
--np launcher reads the ranks' status files: the rank that died without a word, its step
and the instruction it ran); a frozen one by ptc-run's collective timeout on its peer,
which names the collective, the mesh axes, itself and the frozen rank with its step and
instruction (from the status files), then aborts the job. No Open MPI banner.

With --pipeline, the 2 ranks are pipeline stages (4 micro-batches, 1F1B): the frozen
stage's peer times out in a point-to-point receive instead. With --at-start the victim is
frozen while it starts (its peer waits in MPI's start-up, which has no timeout): the
launcher's freeze watch on the ranks' heartbeats names it and ends the job.

usage: dead_rank.py --bin BUILD/bin --workdir DIR [--signal KILL|STOP] [--bound 60] [--pipeline]
                    [--at-start]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import rank_pids  # noqa: E402


# Where ptc-run says a rank stopped: in step N (counted from 1) at an instruction or before
# its first one, or between steps.
WHERE = r"(at step [0-9]+|after step [0-9]+)(, instruction #[0-9]+ \([A-Za-z]+.*\))?"


def in_step_loop(status_file):
    """Whether a rank's status file (its first 32 bytes: "starting", "step N" while step N
    runs, counted from 1, "after step N", ...) says it began its second step."""
    try:
        text = open(status_file, "rb").read(32).decode(errors="replace").strip()
    except OSError:
        return False
    m = re.fullmatch(r"(after )?step ([0-9]+)", text)
    return m is not None and int(m.group(2)) >= 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--bound", type=float, default=60.0)
    ap.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
    ap.add_argument("--pipeline", action="store_true")
    ap.add_argument("--at-start", action="store_true",
                    help="stop the victim as soon as its status file exists (still starting)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda n: os.path.join(args.workdir, n)
    b = lambda t: os.path.join(args.bin, t)
    open(w("text.txt"), "wb").write(open("/usr/share/common-licenses/GPL-3", "rb").read())
    subprocess.run([b("ptc-tokenize"), "-o", w("data.bin"), w("text.txt")], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([b("ptc-model"), "gpt", "--layers", "2", "--hidden", "64", "--heads", "4",
                    "--seq", "32", "--batch", "8", "-o", w("gpt.mlir")], check=True)
    plan = w(f"dead-rank-{args.signal.lower()}{'-pp' if args.pipeline else ''}.plan")
    layout = "mesh=pp:2 microbatches=4" if args.pipeline else "mesh=dp:2"
    subprocess.run([b("ptc-opt"), w("gpt.mlir"), f"--ptc-compile=plan={plan} {layout}", "-o",
                    os.devnull], check=True)
    job = subprocess.Popen([b("ptc-run"), plan, "--np", "2", "--data", w("data.bin"), "--steps",
                            "1000000", "--log-every", "100", "--threads", "1",
                            "--collective-timeout", "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    pids = []
    while time.time() < deadline and len(pids) < 2:
        time.sleep(0.2)
        pids = rank_pids(plan)
    if len(pids) < 2:
        job.kill()
        print("FAIL: the two ranks did not start")
        return 1
    victim = pids[-1]
    environ = dict(v.split(b"=", 1) for v in open(f"/proc/{victim}/environ", "rb").read().split(b"\0")
                   if b"=" in v)
    victim_rank = int(environ[b"OMPI_COMM_WORLD_RANK"])
    # Let it train: stop the victim only once its status file says it is past its first step
    # (however slow the machine, never while it is still starting).
    status_file = os.path.join(environ[b"PTC_STATUS_DIR"].decode(), f"rank-{victim_rank}")
    deadline = time.time() + 300
    while not (os.path.exists(status_file) if args.at_start else in_step_loop(status_file)):
        if time.time() > deadline or job.poll() is not None:
            job.kill()
            print("FAIL: the victim rank did not reach its second step")
            return 1
        time.sleep(0.2)
    os.kill(victim, signal.SIGKILL if args.signal == "KILL" else signal.SIGSTOP)
    killed = time.time()
    try:
        out, _ = job.communicate(timeout=args.bound)
    except subprocess.TimeoutExpired:
        job.kill()
        for pid in rank_pids(plan):
            os.kill(pid, signal.SIGKILL)
        print(f"FAIL: the job still ran {args.bound:.0f} s after a rank was killed (a hang)")
        return 1
    elapsed = time.time() - killed
    tail = "\n".join(out.strip().splitlines()[-12:])
    print(tail)
    named = "rank 1" in out or "rank 0" in out
    if args.signal == "STOP":
        # The peer's timeout names the frozen rank with where it froze, in each form ptc-run
        # prints: in a step at an instruction, in a step before its first instruction, between
        # steps, or still starting. A rank frozen in a step is named by its peer's collective timeout; one
        # frozen while starting (MPI's start-up waits have no timeout) by the launcher's freeze
        # watch, past the collective timeout.
        named = named and re.search(
            rf"rank {victim_rank} is ({WHERE}|starting) "
            r"\(frozen: no heartbeat for [0-9.]+ s\)", out) is not None
        stopped_by = ["did not complete within"]
        if args.at_start:  # (or by the peer's timeout, had the victim passed MPI's start-up)
            stopped_by.append("stopping the job (the launcher's freeze limit is 15 s)")
        named = named and any(s in out for s in stopped_by)
        # In a bounded time: the collective timeout (5 s; the launcher's freeze limit, 15 s, at
        # start) and the job's teardown, with room for a machine several times slower than a
        # quiet one.
        named = named and elapsed < (45.0 if args.at_start else 30.0)
    else:
        named = named and re.search(rf"ptc-run: rank {victim_rank} stopped without reporting an "
                                    rf"error, {WHERE} \(killed by a signal", out) is not None
    # One copy of each error and no Open MPI banner.
    named = named and "MPI_ABORT was invoked" not in out
    ok = job.returncode != 0 and named
    for pid in rank_pids(plan):  # a frozen rank that outlived the job
        os.kill(pid, signal.SIGKILL)
    print(f"job exited with status {job.returncode} {elapsed:.1f} s after rank pid {victim} got "
          f"SIG{args.signal}; error names a rank: {named}")
    print("dead rank:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
