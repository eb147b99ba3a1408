# lit configuration for ptc: compiler tests (dialects/, passes/, tools/).
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "ptc"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "unit", "Inputs", "e2e"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.ptc_obj_root, "test")

llvm_config.with_system_environment(["HOME", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

tool_dirs = [config.ptc_tools_dir, config.llvm_tools_dir]
llvm_config.add_tool_substitutions(
    ["ptc-opt", "ptc-model", "ptc-run", "ptc-tokenize", "ptc-gradcheck", "ptc-ckpt", "ptc-plan-mutate", "ptc-plan", "ptc-train", "split-file"], tool_dirs)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.ptc_tools_dir, append_path=True)

# Reference numerics and small checks use Debian's python (numpy, torch).
config.substitutions.append(("%python", "/usr/bin/python3"))
# The sources and MLIR's TableGen files (tests of the build's generators).
config.substitutions.append(("%ptc_src_root", config.ptc_src_root))
config.substitutions.append(
    ("%tblgen_includes", " ".join("-I " + d for d in [config.ptc_src_root] + config.mlir_include_dirs)))

# ptc-run keeps the best matmul rate it measured (MFU's peak) per machine: the
# tests' in their build folder, not in the home of whoever runs them.
config.environment["PTC_PEAK_CACHE"] = os.path.join(config.ptc_obj_root, "test", "matmul-peak.tsv")

# Multi-rank tests start OpenMPI's mpirun, as root on CI and with more ranks than cores.
for var, value in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                   ("OMPI_MCA_rmaps_base_oversubscribe", "1")):
    config.environment[var] = value

# The CUDA backend compiled in (its kernel table exists without a GPU).
if config.ptc_enable_cuda.upper() in ("ON", "1", "TRUE", "YES"):
    config.available_features.add("cuda-backend")

# A visible NVIDIA GPU: tests that expect "no GPU" do not apply.
if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
    config.available_features.add("gpu")
