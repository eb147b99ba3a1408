#!/usr/bin/python3
"""A stop request: a training run asked to stop by a signal ends at a step boundary with a
checkpoint and exit status 75, and the resumed run gives every step's loss of the
uninterrupted run, bitwise (the same plan and layout).

1. SIGUSR1 to ptc-run's --np launcher (2 ranks, dp:2): it passes the request to mpirun and
   so to every rank; the launcher does not restart the job (--max-restarts 3).
2. SIGUSR1 to one rank only: the ranks agree on the boundary (an all-reduce of the stop
   flags at every step), all of them stop after the same step.
3. SIGTERM to a single-process run (a Kubernetes pod's or Slurm's termination signal).
4. SIGUSR1 to the --np launcher while it starts, before main (its libraries' initializers take
   a few hundred milliseconds; the signal's default action killed it silently, status 138):
   the job still stops after its first step with a checkpoint.

usage: stop_signal.py --bin BUILD/bin --workdir DIR
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import fresh_workdir, lines, losses, mpi_env, rank_pids  # noqa: E402

STEPS = 120


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    fresh_workdir(args.workdir)
    b = lambda t: os.path.join(args.bin, t)
    # Every step 20 ms longer: the signal lands mid-run however fast this machine is.
    env = mpi_env(OMPI_MCA_rmaps_base_oversubscribe="1", PTC_FAULT_SLOW_STEP_MS="20")
    run = lambda *cmd: subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    run(b("ptc-tokenize"), "-o", "data.bin", "/usr/share/common-licenses/GPL-3")
    run(b("ptc-model"), "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
        "--batch", "8", "-o", "gpt.mlir")
    run(b("ptc-opt"), "gpt.mlir", "--ptc-compile=plan=dp2.plan mesh=dp:2", "-o", os.devnull)
    run(b("ptc-opt"), "gpt.mlir", "--ptc-compile=plan=one.plan", "-o", os.devnull)

    def train(plan, name, np=None, extra=(), signal_to=None, sig=signal.SIGUSR1):
        """Runs `plan`; with `signal_to` ('launcher', 'rank', 'process') sends `sig` there once
        the run has logged 12 steps. Returns (status, output)."""
        cmd = [b("ptc-run"), plan, "--data", "data.bin", "--steps", str(STEPS), "--threads", "1",
               "--log-every", "0", "--metrics", f"{name}.jsonl", "--checkpoint-dir", f"{name}-ckpt",
               "--checkpoint-every", "50", *extra]
        if np:
            cmd += ["--np", str(np)]
        job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if signal_to == "starting launcher":
            # Once the launcher blocked its stop signals (its first code, before the
            # libraries' initializers), as early as a signal can be kept.
            def blocked():  # ptc-run itself (exec done), with SIGUSR1 and SIGTERM blocked
                try:
                    exe = os.readlink(f"/proc/{job.pid}/exe")
                    status = open(f"/proc/{job.pid}/status").read()
                except OSError:
                    return False
                mask = int(re.search(r"SigBlk:\s*([0-9a-f]+)", status).group(1), 16)
                return exe.endswith("ptc-run") and mask & 0x4200 == 0x4200
            deadline = time.time() + 60
            while not blocked():
                assert time.time() < deadline and job.poll() is None, "the launcher did not start"
                time.sleep(0.001)
            job.send_signal(sig)
        elif signal_to:
            deadline = time.time() + 60
            while lines(f"{name}.jsonl") < 12:
                assert time.time() < deadline and job.poll() is None, "the run did not start training"
                time.sleep(0.02)
            if signal_to == "rank":
                os.kill(rank_pids(plan)[-1], sig)
            else:
                job.send_signal(sig)
        out, _ = job.communicate(timeout=300)
        return job.returncode, out

    def resume_and_compare(plan, name, reference, np=None):
        status, out = train(plan, name, np, extra=["--resume", f"{name}-ckpt"])
        assert status == 0, out
        got = losses(f"{name}.jsonl")
        assert sorted(got) == list(range(1, STEPS + 1)), sorted(got)
        bad = [s for s in got if got[s] != reference[s]]
        assert not bad, f"steps {bad[:5]} differ from the uninterrupted run"

    def stopped_at(status, out, name, by):
        assert status == 75, (status, out)
        m = re.search(rf"ptc-run: stopped by {by} after step (\d+) of {STEPS}; checkpoint in "
                      rf"{name}-ckpt/step-(\d+) \(continue with --resume {name}-ckpt\); exit status 75", out)
        assert m, out
        step = int(m.group(1))
        assert 12 <= step < STEPS and int(m.group(2)) == step, out
        assert open(f"{name}-ckpt/latest").read().strip() == f"step-{step:08d}"
        return step

    status, out = train("dp2.plan", "reference2", np=2)
    assert status == 0, out
    reference2 = losses("reference2.jsonl")

    # 1. The launcher is asked.
    status, out = train("dp2.plan", "launcher", np=2, extra=["--max-restarts", "3"], signal_to="launcher")
    step = stopped_at(status, out, "launcher", "SIGUSR1")
    assert "ptc-run: the job was asked to stop: not restarting" in out, out
    assert "restart 1" not in out, out
    print(f"1. launcher: stopped after step {step}")
    resume_and_compare("dp2.plan", "launcher", reference2, np=2)

    # 2. One rank is asked: both stop after the same step (rank 0 prints the line; the
    # checkpoint is complete, so both wrote their shards at that boundary).
    status, out = train("dp2.plan", "rank", np=2, signal_to="rank")
    step = stopped_at(status, out, "rank", "a signal to another rank")
    print(f"2. one rank: both stopped after step {step}")
    resume_and_compare("dp2.plan", "rank", reference2, np=2)

    # 3. SIGTERM to a single process.
    status, out = train("one.plan", "reference1")
    assert status == 0, out
    reference1 = losses("reference1.jsonl")
    status, out = train("one.plan", "term", signal_to="process", sig=signal.SIGTERM)
    step = stopped_at(status, out, "term", "SIGTERM")
    print(f"3. SIGTERM: stopped after step {step}")
    resume_and_compare("one.plan", "term", reference1)

    # 4. The launcher is asked while it starts.
    status, out = train("dp2.plan", "early", np=2, signal_to="starting launcher")
    assert status == 75, (status, out)
    m = re.search(rf"ptc-run: stopped by SIGUSR1 after step (\d+) of {STEPS}; checkpoint in "
                  r"early-ckpt/step-(\d+)", out)
    assert m and int(m.group(1)) == int(m.group(2)) >= 1, out
    print(f"4. launcher while starting: stopped after step {m.group(1)}")
    resume_and_compare("dp2.plan", "early", reference2, np=2)
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
