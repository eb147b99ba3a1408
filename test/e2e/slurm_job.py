#!/usr/bin/python3
"""ptc jobs on a real Slurm: a one-node cluster (munged + slurmctld + slurmd, Debian's
munge and slurm-wlm) started under WORKDIR/cluster by scripts/slurm-local.sh and stopped at
the end. configs/slurm/ptc-train.sbatch is submitted with sbatch; ptc-train starts the 4
ranks with srun (Open MPI through Slurm's PMIx; no mpirun).

1. requeue: the job trains, `scancel --signal=USR1 JOB` reaches the ranks, which stop at
   a step boundary with a checkpoint (exit 75); the job script requeues the job, and the
   second start resumes from that checkpoint and finishes. Every step's loss equals the
   uninterrupted run's (the same plan on the same 4 ranks, under mpirun).
2. elastic (--elastic): the same, but the signal goes to the batch shell (`scancel --batch`,
   as Slurm's --signal=B:USR1@T before a time limit) and the requeued job is given 2 tasks (`scontrol update
   NumTasks=2`, as a shrunken allocation): ptc-train re-plans for 2 ranks and continues;
   the losses stay within 1e-5 of the uninterrupted 4-rank run.
3. cancel: `scancel JOB` (SIGTERM to the batch shell and the ranks): the ranks stop at a step
   boundary with a checkpoint and the script does not requeue; the job ends CANCELLED.

Where Slurm cannot start here (not root, munge or slurm-wlm missing) the test says why and
exits 77, which ctest reports as skipped.

usage: slurm_job.py --bin BUILD/bin --source SOURCE_DIR --workdir DIR [--scenario requeue|elastic|cancel]
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import fresh_workdir, lines, losses, mpi_env, small_gpt_job  # noqa: E402

EVERY = 10
# The requeue continues in the same layout (bitwise); the elastic one in another, whose
# rounding differences grow with every step after the change: 50 steps keep them under 1e-5
# (a run of 120 reached 1e-3 at one step).
STEPS = {"requeue": 120, "elastic": 50, "cancel": 120}

def job(folder, steps, every):
    return small_gpt_job(steps, lr="1e-3", log_every=100, sections=f"""
[job]
dir = "{folder}"

[checkpoint]
every = {every}

[launch]
cluster = "dgx-a100-ib"
""")


class Cluster:
    def __init__(self, source, folder):
        self.script = os.path.join(source, "scripts", "slurm-local.sh")
        self.folder = folder
        out = subprocess.run(["bash", self.script, "start", folder], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"the Slurm cluster did not start:\n{out.stdout}{out.stderr}")
        self.env = dict(os.environ, SLURM_CONF=os.path.join(folder, "slurm.conf"))

    def __call__(self, *cmd):
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        assert out.returncode == 0, f"{' '.join(cmd)}: {out.stdout}{out.stderr}"
        return out.stdout

    def job(self, jid):
        text = self("scontrol", "show", "job", "-o", jid)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, jid, predicate, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.job(jid)
            if predicate(info):
                return info
            time.sleep(0.2)
        sys.exit(f"job {jid} did not get to {what} in {timeout} s: {info}")

    def stop(self):
        subprocess.run(["bash", self.script, "stop", self.folder], capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--scenario", choices=["requeue", "elastic", "cancel"], default="requeue")
    args = ap.parse_args()
    steps = STEPS[args.scenario]
    check = subprocess.run(["bash", os.path.join(args.source, "scripts", "slurm-local.sh"), "check"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        print(check.stdout + check.stderr + "skipped: no Slurm cluster can run here")
        return 77
    fresh_workdir(args.workdir)
    b = lambda t: os.path.join(args.bin, t)
    subprocess.run([b("ptc-tokenize"), "-o", "data.bin", "/usr/share/common-licenses/GPL-3"],
                   check=True, stdout=subprocess.DEVNULL)
    for name in ("reference", "slurm"):
        with open(f"{name}.toml", "w") as f:
            f.write(job(f"runs/{name}", STEPS[args.scenario], EVERY))
    # The uninterrupted run: the same job under mpirun on this machine.
    env = mpi_env()
    env.pop("SLURM_JOB_ID", None)
    ref = subprocess.run([b("ptc-train"), "reference.toml"], env=env, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    reference = losses("runs/reference/metrics.jsonl")

    cluster = Cluster(args.source, os.path.abspath("cluster"))
    # Every step 20 ms longer: the stop request lands mid-run however fast this machine is.
    cluster.env["PTC_FAULT_SLOW_STEP_MS"] = "20"
    try:
        extra = ["--elastic"] if args.scenario == "elastic" else []
        jid = cluster("sbatch", "--parsable", f"--chdir={os.getcwd()}", "--output=slurm.out",
                      f"--export=ALL,PTC_BIN={args.bin}",
                      os.path.join(args.source, "configs", "slurm", "ptc-train.sbatch"),
                      "slurm.toml", *extra).strip().split(";")[0]
        print(f"submitted job {jid}")
        # Training: then the ranks are asked to stop.
        deadline = time.time() + 120
        while lines("runs/slurm/metrics.jsonl") < 12:
            assert time.time() < deadline, open("slurm.out").read() if os.path.exists("slurm.out") else "no output"
            time.sleep(0.05)
        # requeue: the ranks are signalled (scancel's default: the job's steps); elastic: the
        # batch shell is, as Slurm's --signal=B:USR1@T does before a time limit, and the
        # script passes it on; cancel: scancel ends the job (SIGTERM to the shell and the
        # ranks), which stops at a checkpoint and is not requeued.
        if args.scenario == "cancel":
            cluster("scancel", jid)
            info = cluster.wait(jid, lambda j: j.get("JobState") not in ("RUNNING", "CONFIGURING", "COMPLETING"),
                                "its end")
            log = open("slurm.out").read()
            print(log)
            assert info["JobState"] == "CANCELLED" and info.get("Restarts") == "0", info
            stop = re.search(r"ptc-run: stopped by SIGTERM after step (\d+) of %d" % steps, log)
            assert stop, "no stop at a step boundary in the log"
            stopped = int(stop.group(1))
            assert "ptc-train.sbatch: the job stopped at a checkpoint after SIGTERM: not requeueing" in log
            assert "requeueing job" not in log
            latest = open("runs/slurm/checkpoints/latest").read().strip()
            assert latest == "step-%08d" % stopped, (latest, stopped)
            got = losses("runs/slurm/metrics.jsonl")
            assert all(got[s] == reference[s] for s in got), "the losses before the stop differ"
            print(f"cancelled: stopped after step {stopped} with its checkpoint; not requeued")
            print("ok")
            return 0
        if args.scenario == "requeue":
            cluster("scancel", "--signal=USR1", jid)
        else:
            cluster("scancel", "--batch", "--signal=USR1", jid)
        # The script requeues the job: it waits (Slurm delays a requeued job's start).
        cluster.wait(jid, lambda j: j.get("JobState") == "PENDING" and j.get("Restarts") == "1",
                     "requeued (PENDING, Restarts=1)")
        # The first start's job step is gone (its slurmstepd removes its PMIx socket)
        # before the second start, which the test does not make wait Slurm's two minutes.
        while subprocess.run(["pgrep", "-f", f"slurmstepd: \\[{jid}\\."], capture_output=True).returncode == 0:
            time.sleep(0.2)
        # A start within the second of the requeue is refused (slurmd: "already killed": the
        # new credential is not newer than the old one's revocation, to the second).
        time.sleep(2)
        update = ["scontrol", "update", f"JobId={jid}", "StartTime=now"]
        if args.scenario == "elastic":
            update.append("NumTasks=2")
        cluster(*update)
        info = cluster.wait(jid, lambda j: j.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                     "COMPLETING", "REQUEUED"),
                            "its end", timeout=180)
        log = open("slurm.out").read()
        print(log)
        assert info["JobState"] == "COMPLETED", info
        stop = re.search(r"ptc-run: stopped by SIGUSR1 after step (\d+) of %d" % steps, log)
        assert stop, "no stop at a step boundary in the log"
        stopped = int(stop.group(1))
        assert stopped < steps
        for expected in (
                "ptc-train.sbatch: job %s on 4 tasks, start 1" % jid,
                "ptc-train: srun --ntasks=4 --mpi=pmix",
                "ptc-train.sbatch: the job stopped at a checkpoint: requeueing job %s" % jid,
                "start 2",
                "ptc-run: resumed from runs/slurm/checkpoints at step %d" % stopped,
                "ptc-run: checkpoint of step %d in runs/slurm/checkpoints" % steps):
            assert expected in log, f"missing from the log: {expected!r}"
        assert not re.search(r"^ptc-train: ptc-run ", log, re.M), "ptc-run's own launcher (mpirun) was used"
        tolerance = 0.0
        if args.scenario == "elastic":
            for expected in ("ptc-train: elastic: 2 ranks are available (Slurm's job %s (NumTasks=2)) but "
                             "the layout needs 4: re-planning for 2" % jid,
                             "ptc-train: elastic: layout mesh=dp:2,tp:2 -> ",
                             "ptc-train: srun --ntasks=2 --mpi=pmix",
                             "collectives: MPI, 2 ranks"):
                assert expected in log, f"missing from the log: {expected!r}"
            assert "ptc-train.sbatch: SIGUSR1 (the time limit is near" in log
            tolerance = 1e-5
        got = losses("runs/slurm/metrics.jsonl")
        assert sorted(got) == list(range(1, steps + 1))
        worst = max(abs(got[s] - reference[s]) for s in got)
        print(f"stopped after step {stopped}; largest difference from the uninterrupted run over "
              f"{steps} steps: {worst:.2e}")
        assert worst <= tolerance, worst
        print("ok")
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
