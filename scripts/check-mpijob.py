#!/usr/bin/python3
"""Checks, offline, a Kubernetes manifest that runs ptc-train as an MPIJob of the Kubeflow MPI
Operator (kubeflow.org/v2beta1), against what ptc reads:

- the launcher runs ptc-train on a job file that comes from a ConfigMap of the manifest; that
  job file passes `ptc-train --dry-run` (every key known and valid);
- the job's ranks fit the workers: the mesh's product = Worker replicas x slotsPerWorker, and
  the job starts them with mpirun over the operator's hostfile (/etc/mpi/hostfile);
- every path the ranks share (the job's folder, with the plans and checkpoints; the data;
  the checkpoint folder; eval data; initial weights) is on a volume mounted at that path in
  the launcher and in the workers, backed by one ReadWriteMany claim;
- it resumes: the job has [checkpoint], the launcher restarts OnFailure (exit 75 after a
  stop, or a failure beyond ptc-run's restarts) with a backoffLimit, and its grace period
  leaves time for the checkpoint that SIGTERM triggers (>= 60 s).

usage: check-mpijob.py MANIFEST.yaml [--bin BUILD/bin]    (exit 0: ok; 1: the errors printed)
"""
import argparse
import os
import subprocess
import sys
import tempfile
import tomllib

import yaml

HOSTFILE = "/etc/mpi/hostfile"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"))
    args = ap.parse_args()
    errors = []
    err = errors.append
    try:
        docs = [d for d in yaml.safe_load_all(open(args.manifest)) if d]
    except (OSError, yaml.YAMLError) as e:
        print(f"check-mpijob: {args.manifest}: error: {e}")
        return 1
    of_kind = lambda kind: [d for d in docs if d.get("kind") == kind]
    jobs = of_kind("MPIJob")
    if len(jobs) != 1:
        print(f"check-mpijob: {args.manifest}: error: expected one MPIJob, found {len(jobs)}")
        return 1
    mpijob = jobs[0]
    name = mpijob.get("metadata", {}).get("name", "?")
    where = f"MPIJob {name}"
    if mpijob.get("apiVersion") != "kubeflow.org/v2beta1":
        err(f"{where}: apiVersion {mpijob.get('apiVersion')!r}: this check (and ptc's docs) are for "
            "kubeflow.org/v2beta1")
    spec = mpijob.get("spec", {})
    if spec.get("mpiImplementation", "OpenMPI") != "OpenMPI":
        err(f"{where}: mpiImplementation {spec['mpiImplementation']!r}: ptc is built with Open MPI")
    replicas = spec.get("mpiReplicaSpecs", {})
    launcher, worker = replicas.get("Launcher"), replicas.get("Worker")
    if not launcher or not worker:
        err(f"{where}: mpiReplicaSpecs needs Launcher and Worker")
        return report(args.manifest, errors)
    if launcher.get("replicas", 1) != 1:
        err(f"{where}: Launcher replicas must be 1")
    slots = spec.get("slotsPerWorker", 1)
    workers = worker.get("replicas", 1)

    def pod(spec_, role):
        podspec = spec_.get("template", {}).get("spec", {})
        containers = podspec.get("containers", [])
        if not containers:
            err(f"{where}: the {role} has no container")
            return podspec, {}
        return podspec, containers[0]

    lpod, lcont = pod(launcher, "Launcher")
    wpod, wcont = pod(worker, "Worker")
    command = (lcont.get("command") or []) + (lcont.get("args") or [])
    if not command or not command[0].endswith("ptc-train"):
        err(f"{where}: the launcher's command {command} does not run ptc-train")
        return report(args.manifest, errors)
    jobfile = next((a for a in command[1:] if not a.startswith("-")), None)
    if not jobfile:
        err(f"{where}: the launcher's command names no job file")
        return report(args.manifest, errors)

    def mounts(podspec, container):
        """mountPath -> the volume's source (('configMap', name) or ('claim', name) or ...)."""
        volumes = {v["name"]: v for v in podspec.get("volumes", [])}
        out = {}
        for m in container.get("volumeMounts", []):
            v = volumes.get(m["name"])
            if v is None:
                err(f"{where}: volumeMount {m['name']!r} names no volume of its pod")
                continue
            if "configMap" in v:
                out[m["mountPath"]] = ("configMap", v["configMap"]["name"])
            elif "persistentVolumeClaim" in v:
                out[m["mountPath"]] = ("claim", v["persistentVolumeClaim"]["claimName"])
            else:
                out[m["mountPath"]] = (next(iter(k for k in v if k != "name")), v["name"])
        return out

    def mount_of(table, path):
        best = None
        for mount in table:
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                if best is None or len(mount) > len(best):
                    best = mount
        return best

    lmounts, wmounts = mounts(lpod, lcont), mounts(wpod, wcont)
    jobmount = mount_of(lmounts, jobfile)
    if not jobmount or lmounts[jobmount][0] != "configMap":
        err(f"{where}: the job file {jobfile} is not on a ConfigMap volume of the launcher")
        return report(args.manifest, errors)
    configmap = next((c for c in of_kind("ConfigMap") if c["metadata"]["name"] == lmounts[jobmount][1]), None)
    key = os.path.relpath(jobfile, jobmount)
    if configmap is None or key not in configmap.get("data", {}):
        err(f"{where}: the job file {jobfile}: ConfigMap {lmounts[jobmount][1]!r} with key {key!r} "
            "is not in the manifest")
        return report(args.manifest, errors)
    text = configmap["data"][key]
    job = tomllib.loads(text)

    # Every key ptc-train reads: its own check.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, os.path.basename(jobfile))
        open(path, "w").write(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        out = subprocess.run([os.path.join(os.path.abspath(args.bin), "ptc-train"), path, "--dry-run"],
                             capture_output=True, text=True, cwd=tmp, env=env)
        if out.returncode != 0:
            err(f"ConfigMap {configmap['metadata']['name']}/{key}: " +
                out.stderr.strip().replace(path, key))

    # The ranks: mpirun over the operator's hostfile, as many as the mesh.
    launch = job.get("launch", {})
    if launch.get("launcher", "auto") not in ("auto", "mpirun"):
        err(f"{key}: launch.launcher = {launch['launcher']!r}: an MPIJob's launcher starts the ranks with mpirun")
    if launch.get("hostfile") != HOSTFILE:
        err(f"{key}: launch.hostfile = {launch.get('hostfile')!r}: the MPI Operator's hostfile is {HOSTFILE} "
            "(ptc-run passes it to mpirun and counts its slots)")
    ranks = 1
    for axis in job.get("parallelism", {}).get("mesh", "").split(","):
        if ":" in axis:
            ranks *= int(axis.split(":")[1])
    if ranks != workers * slots:
        err(f"{where}: {workers} workers x {slots} slots = {workers * slots} ranks, but the job's mesh "
            f"{job.get('parallelism', {}).get('mesh', '(none)')!r} needs {ranks}")
    if launch.get("elastic"):
        err(f"{key}: launch.elastic: the v2beta1 operator recreates a lost worker under the same name and "
            "keeps the hostfile, so there is never a smaller allocation to re-plan for; use "
            "checkpoint.max_restarts")

    # Shared paths: on one ReadWriteMany claim, mounted at the same path on both sides.
    jobdir = job.get("job", {}).get("dir", "runs/" + job.get("job", {}).get("name", os.path.splitext(key)[0]))
    shared = {"job.dir": jobdir}
    data = job.get("training", {}).get("data", [])
    for i, d in enumerate([data] if isinstance(data, str) else data):
        shared[f"training.data[{i}]"] = d
    for k in ("checkpoint.dir", "eval.data", "training.init"):
        section, field = k.split(".")
        if field in job.get(section, {}):
            shared[k] = job[section][field]
    claims = {c["metadata"]["name"]: c for c in of_kind("PersistentVolumeClaim")}
    for what, path in shared.items():
        if not os.path.isabs(path):
            err(f"{key}: {what} = {path!r} is relative: the ranks run in the workers' own folders; give a "
                "path on the shared volume")
            continue
        lm, wm = mount_of(lmounts, path), mount_of(wmounts, path)
        if lm is None or wm is None or lm != wm or lmounts[lm] != wmounts[wm] or lmounts[lm][0] != "claim":
            err(f"{key}: {what} = {path!r} is not on a volume claim mounted at the same path in the launcher "
                "and the workers (the ranks read and write it)")
            continue
        claim = claims.get(lmounts[lm][1])
        if claim is not None and "ReadWriteMany" not in claim.get("spec", {}).get("accessModes", []):
            err(f"PersistentVolumeClaim {claim['metadata']['name']}: accessModes {claim['spec'].get('accessModes')}: "
                "the launcher and every worker mount it: ReadWriteMany")

    # Resume.
    if not job.get("checkpoint"):
        err(f"{key}: no [checkpoint]: a restarted launcher would start the training again from step 0")
    if launcher.get("restartPolicy") != "OnFailure":
        err(f"{where}: Launcher restartPolicy {launcher.get('restartPolicy')!r}: OnFailure restarts it after a "
            "stop (exit 75) or a failure, and ptc-train resumes from the checkpoint")
    if "backoffLimit" not in spec.get("runPolicy", {}):
        err(f"{where}: runPolicy.backoffLimit: set how many times the launcher may restart")
    grace = lpod.get("terminationGracePeriodSeconds", 30)
    if grace < 60:
        err(f"{where}: the launcher's terminationGracePeriodSeconds {grace}: SIGTERM stops the ranks at the next "
            "step boundary with a checkpoint; give it at least 60 s")
    if not errors:
        print(f"check-mpijob: {args.manifest}: ok: {where}: {workers} workers x {slots} slots = {ranks} ranks for "
              f"mesh {job['parallelism']['mesh']!r}; job file {jobfile} (ConfigMap "
              f"{configmap['metadata']['name']}) passes ptc-train --dry-run; {len(shared)} shared paths on "
              f"claim(s) {sorted({lmounts[mount_of(lmounts, p)][1] for p in shared.values()})}; resumes from "
              f"checkpoints (restartPolicy OnFailure, backoffLimit {spec['runPolicy']['backoffLimit']}, "
              f"grace {grace} s)")
    return report(args.manifest, errors)


def report(manifest, errors):
    for e in errors:
        print(f"check-mpijob: {manifest}: error: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
