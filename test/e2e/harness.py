"""What the end-to-end scripts share: paths in the work directory, the ptc tools, a runner
that lets OpenMPI start as root and oversubscribe this machine's cores, the losses of a
metrics file, and the rank processes of a plan."""
import json
import os
import shutil
import subprocess


_SESSION_DIR = None


def mpi_env(**extra):
    """This process's environment with OpenMPI allowed to start as root (as this machine's
    jobs run), plus `extra`. Each test script's mpiruns keep their session files in a folder
    of their own: two tests starting mpirun at the same moment (ctest -j) in the one shared
    session folder can make one of them fail ("ORTE_ERROR_LOG ... session_dir.c")."""
    global _SESSION_DIR
    if _SESSION_DIR is None:
        import atexit
        import tempfile
        _SESSION_DIR = tempfile.mkdtemp(prefix="ompi-", dir="/tmp")
        atexit.register(shutil.rmtree, _SESSION_DIR, True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)
    env.setdefault("OMPI_MCA_orte_tmpdir_base", _SESSION_DIR)
    return env


def fresh_workdir(path):
    """Empties `path` (creating it) and makes it the current directory."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    os.chdir(path)


def small_gpt_job(steps, lr, log_every, sections=""):
    """A ptc-train job file: a 2-layer GPT on dp:2 x tp:2 trained on data.bin, metrics as JSON
    lines only, with the job's own `sections` ([job], [checkpoint], [launch], ...) added."""
    return f"""
[model]
name = "gpt"
layers = 2
hidden = 64
heads = 4
vocab = 256

[training]
steps = {steps}
batch = 8
seq = 32
data = "data.bin"
threads = 1

[optimizer]
name = "adamw"
lr = {lr}

[parallelism]
mesh = "dp:2,tp:2"

[metrics]
log_every = {log_every}
csv = false
tensorboard = false
{sections}"""


def tools(bin_dir, workdir):
    """Returns (w, b, run): w(name) is a path in `workdir` (created), b(tool) the tool in
    `bin_dir`, run(*cmd) runs a command (quietly, failing on a non-zero status)."""
    os.makedirs(workdir, exist_ok=True)
    env = mpi_env(OMPI_MCA_rmaps_base_oversubscribe="1")
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
