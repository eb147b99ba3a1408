"""What the end-to-end scripts share: paths in the work directory, the ptc tools, and a
runner that lets OpenMPI start as root and oversubscribe this machine's cores."""
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
