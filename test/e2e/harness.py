"""What the end-to-end scripts share: paths in the work directory, the ptc tools, a runner
that lets OpenMPI start as root and oversubscribe this machine's cores, the losses of a
metrics file, and the rank processes of a plan."""
import json
import os
import subprocess


def tools(bin_dir, workdir):
    """Returns (w, b, run): w(name) is a path in `workdir` (created), b(tool) the tool in
    `bin_dir`, run(*cmd) runs a command (quietly, failing on a non-zero status)."""
    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    w = lambda name: os.path.join(workdir, name)
    b = lambda tool: os.path.join(bin_dir, tool)
    run = lambda *cmd: subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return w, b, run


def losses(path):
    """step -> the last loss a metrics JSON-lines file logs for it (a resumed run logs the
    steps after its checkpoint again)."""
    out = {}
    for line in open(path):
        row = json.loads(line)
        out[row["step"]] = row["loss"]
    return out


def lines(path):
    """The lines of `path` so far (0 while it does not exist)."""
    try:
        return sum(1 for _ in open(path))
    except OSError:
        return 0


def rank_pids(plan):
    """The ptc-run processes running `plan` as ranks (not the --np launcher that started them)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"ptc-run") and plan.encode() in cmd and b"--np" not in cmd:
            pids.append(int(pid))
    return sorted(pids)
