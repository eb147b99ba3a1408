#!/usr/bin/env bash
# GPU check of the CUDA backend, on a machine with an NVIDIA GPU, CUDA 13,
# cmake, ninja and PyTorch but no MLIR, MPI, oneDNN, FlatBuffers headers or
# network. Prepare the carried folder here first:
#   bash bench/gpu_prepare.sh            # writes .gpu-carry/ (git-ignored, ~60 MB)
# then, on the GPU machine, from the repository root with .gpu-carry/ beside it:
#   OUT=/some/dir bash bench/gpu_check.sh
# It
#  1. builds the runtime there (no compiler, no MPI; dependencies from .gpu-carry/deps),
#  2. runs every CUDA kernel against the CPU kernel (ptc-device-tests, label gpu),
#  3. trains the standard GPT on the GPU and compares the losses with the CPU
#     backend's (computed by gpu_prepare.sh): fp32 within 1e-4 relative; bf16
#     within 2e-2 relative (bf16 rounding of every activation; the CPU rounds the
#     same values, but sums in a different order, so the runs drift apart slowly),
#     and runs the fp32 and bf16 plans a second time: bitwise equal losses,
#  4. times bf16 causal attention (ptc-bench-cuda-attention: cuDNN's fused attention
#     through the CUDA device) beside PyTorch's scaled_dot_product_attention at its
#     best backend (bench/gpu_torch_sdpa.py) on GPT-2 medium's and a Llama-style
#     grouped-query layer,
#  5. benchmarks a GPT-2-medium-sized training step (24 layers, hidden 1024, seq
#     1024, batch 8, bf16) with ptc-run and with PyTorch eager on the same GPU:
#     tokens/s and MFU of both (PTC_PEAK_TFLOPS, default 989: H100/H200 dense bf16).
# Results: $OUT/summary.txt (and logs beside it). Exit status: non-zero when a
# kernel test or a loss comparison fails.
# PTC_GPU_CHECK_PARTS (default "kernels losses attention bench") picks the parts after the build,
# e.g. PTC_GPU_CHECK_PARTS=kernels to iterate on a failing kernel quickly.
# With this workplace's device tool: run(command="bash bench/gpu_check.sh",
# carry=[".gpu-carry"], timeout_s=540); the build takes a few minutes of it. If
# the build fails there, the binaries gpu_prepare.sh built here are used.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ptc-gpu-check}
mkdir -p "$OUT"
C=$PWD/.gpu-carry
P=$C/plans
PEAK=${PTC_PEAK_TFLOPS:-989}
STEPS=${PTC_GPU_CHECK_STEPS:-50}
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
status=0
[ -d "$C/deps" ] || { echo "gpu_check: $C is missing; run bench/gpu_prepare.sh first" >&2; exit 2; }
export LD_LIBRARY_PATH=$C/deps/lib:${LD_LIBRARY_PATH:-}
PY=${PYTHON:-python3}
PARTS=" ${PTC_GPU_CHECK_PARTS:-kernels losses attention bench} "
part() { [[ "$PARTS" == *" $1 "* ]]; }

say "== GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
# NCCL: the CUDA toolkit's, else the one PyTorch's wheels bring.
NCCL_ARGS=()
if ! ls /usr/local/cuda/lib64/libnccl.so* /usr/local/cuda/lib/libnccl.so* >/dev/null 2>&1; then
  NCCL_DIR=$($PY -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
  if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/include/nccl.h" ]; then
    NCCL_LIB=$(ls "$NCCL_DIR"/lib/libnccl.so* | head -1)
    NCCL_ARGS=(-DNCCL_INCLUDE_DIR="$NCCL_DIR/include" -DNCCL_LIBRARY="$NCCL_LIB")
    export LD_LIBRARY_PATH=$NCCL_DIR/lib:$LD_LIBRARY_PATH
  fi
fi

# cuDNN: the newest copy there (PyTorch's wheel, 9.19, where the system's is 9.14): the
# deterministic fused attention backward needs 9.18.1 or later, at build and run time.
CUDNN_ARGS=()
CUDNN_DIR=$($PY -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2>/dev/null || true)
if [ -n "$CUDNN_DIR" ] && [ -f "$CUDNN_DIR/include/cudnn_graph.h" ]; then
  CUDNN_LIB=$(ls "$CUDNN_DIR"/lib/libcudnn.so* | head -1)
  CUDNN_ARGS=(-DCUDNN_INCLUDE_DIR="$CUDNN_DIR/include" -DCUDNN_LIBRARY="$CUDNN_LIB")
  export LD_LIBRARY_PATH=$CUDNN_DIR/lib:$LD_LIBRARY_PATH
fi

# 1. Build (runtime only).
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTC_BUILD_COMPILER=OFF \
  -DPTC_WITH_MPI=OFF -DPTC_WITH_OPENBLAS=OFF -DPTC_DEPS_DIR="$C/deps" -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${NCCL_ARGS[@]}" "${CUDNN_ARGS[@]}" > "$OUT/build.log" 2>&1 &&
  ninja -C build-gpu ptc-run ptc-device-tests ptc-runtime-tests ptc-bench-cuda-attention \
    ptc-bench-cuda-matmul >> "$OUT/build.log" 2>&1
if [ $? -eq 0 ]; then
  say "build: ok in $(( $(date +%s) - t0 )) s"
  B=build-gpu/bin
  T=build-gpu/test
elif "$C/bin/ptc-run" --help > /dev/null 2>&1; then
  say "build: FAILED (see build.log); using the binaries built by gpu_prepare.sh"
  tail -15 "$OUT/build.log"
  B=$C/bin
  T=$C/bin
else
  say "build: FAILED (see build.log), and the carried binaries do not start"; tail -30 "$OUT/build.log"; exit 1
fi

# 2. Kernels: CUDA against CPU.
if part kernels; then
# cuDNN's own errors (why a graph is refused) go to cudnn-errors.log.
CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGDEST_DBG="$OUT/cudnn-errors.log" $T/ptc-device-tests > "$OUT/device-tests.log" 2>&1
rc=$?
grep -h "cuDNN" "$OUT/device-tests.log" | sort -u | head -12 | tee -a "$SUMMARY"
say "kernel tests (ptc-device-tests): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$OUT/device-tests.log" | tr -s ' \n' ' ')"
if grep -q "skipped: no GPU" "$OUT/device-tests.log"; then say "kernel tests: SKIPPED (no GPU visible)"; status=1; fi
[ $rc -eq 0 ] || { status=1; grep -B2 -A8 "Failure\|FAILED" "$OUT/device-tests.log" | head -60;
                   [ -s "$OUT/cudnn-errors.log" ] && grep -v "^\s*$" "$OUT/cudnn-errors.log" | head -40; }
if [ -x $T/ptc-runtime-tests ]; then
  $T/ptc-runtime-tests > "$OUT/runtime-tests.log" 2>&1 || { status=1; say "runtime tests: FAILED"; }
fi
fi

# 3. Losses: GPU against CPU, standard GPT, same seed and data.
compare() { # name gpu.jsonl cpu.jsonl rtol
  $PY - "$@" <<'PY'
import json, sys
name, gpu, cpu, rtol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
try:
    g = [json.loads(l)["loss"] for l in open(gpu)]
except OSError:
    print(f"{name}: no GPU losses: FAILED")
    sys.exit(1)
c = [json.loads(l)["loss"] for l in open(cpu)]
n = min(len(g), len(c))
worst = max(abs(a - b) / abs(b) for a, b in zip(g[:n], c[:n])) if n else float("inf")
ok = n == len(c) and worst <= rtol
print(f"{name}: {n} steps, loss {c[0]:.4f} -> {c[n-1]:.4f} (cpu) / {g[n-1]:.4f} (gpu), "
      f"max relative difference {worst:.2e} (bound {rtol:g}): {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
}
if part losses; then
for p in fp32 bf16 bf16off; do
  $B/ptc-run "$P/gpt-$p.plan" --device cuda --data "$P/data.bin" --steps "$STEPS" --log-every 0 \
    --metrics "$OUT/gpu-$p.jsonl" > "$OUT/train-$p.log" 2>&1 || { status=1; say "train $p: FAILED"; tail -5 "$OUT/train-$p.log"; }
done
bound_fp32=1e-4; bound_bf16=2e-2; bound_bf16off=2e-2
for p in fp32 bf16 bf16off; do
  bound=bound_$p
  compare "losses $p (GPU vs CPU)" "$OUT/gpu-$p.jsonl" "$P/cpu-$p.jsonl" "${!bound}" | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
# The same plan twice on the GPU: bitwise the same losses.
for p in fp32 bf16; do
  $B/ptc-run "$P/gpt-$p.plan" --device cuda --data "$P/data.bin" --steps "$STEPS" --log-every 0 \
    --metrics "$OUT/gpu-$p-again.jsonl" > "$OUT/train-$p-again.log" 2>&1 || { status=1; say "train $p again: FAILED"; }
  if cmp -s <($PY -c "import json,sys; [print(repr(json.loads(l)['loss'])) for l in open(sys.argv[1])]" "$OUT/gpu-$p.jsonl") \
            <($PY -c "import json,sys; [print(repr(json.loads(l)['loss'])) for l in open(sys.argv[1])]" "$OUT/gpu-$p-again.jsonl"); then
    say "repeatability $p: two runs of the same plan, $STEPS steps: bitwise equal losses: ok"
  else
    say "repeatability $p: two runs of the same plan differ: FAILED"; status=1
  fi
done
head -1 "$OUT/train-bf16.log" | tee -a "$SUMMARY"
fi

# 3b. Attention: ptc's bf16 attention (cuDNN) against PyTorch's SDPA, same shapes, same run.
if part attention; then
SHAPES="gpt2-medium:8:16:16:1024:64 llama-gqa:4:32:8:2048:128"
$B/ptc-bench-cuda-attention $SHAPES > "$OUT/attention-ptc.txt" 2>&1 || { status=1; say "ptc-bench-cuda-attention: FAILED"; }
$PY bench/gpu_torch_sdpa.py $SHAPES > "$OUT/attention-torch.jsonl" 2> "$OUT/attention-torch.log" || { status=1; say "gpu_torch_sdpa: FAILED"; tail -3 "$OUT/attention-torch.log"; }
cat "$OUT/attention-ptc.txt" | tee -a "$SUMMARY"
$PY - "$OUT/attention-ptc.txt" "$OUT/attention-torch.jsonl" <<'PY' | tee -a "$SUMMARY"
import json, sys
ptc = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 11 and f[1].isdigit():
        ptc[f[0]] = (float(f[6]), float(f[8]), float(f[10]))
layers = {"gpt2-medium": 24, "llama-gqa": 16}
for line in open(sys.argv[2]):
    t = json.loads(line)
    name = t["name"]
    if "error" in t or name not in ptc:
        print(f"attention {name}: no comparison ({t.get('error', 'ptc did not run it')})")
        continue
    fwd, bwd, both = ptc[name]
    n = layers.get(name, 1)
    print(f"attention {name} (x{n} layers): ptc fwd {fwd * n:.2f} ms bwd {bwd * n:.2f} ms | torch "
          f"({t['backend']}) fwd {t['fwd_ms'] * n:.2f} ms bwd {t['bwd_ms'] * n:.2f} ms | "
          f"ptc / torch fwd+bwd: {both / t['fwd_bwd_ms']:.2f}x")
PY
fi

# 4. Benchmark: GPT-2 medium, bf16, ptc-run vs PyTorch eager.
if part bench; then
$B/ptc-run "$P/gpt2-medium-bf16.plan" --device cuda --data "$P/data.bin" --steps 8 --log-every 1 \
  --metrics "$OUT/gpt2m-ptc.jsonl" --memory-report > "$OUT/gpt2m-ptc.log" 2>&1 || { status=1; say "gpt2-medium ptc-run: FAILED"; tail -5 "$OUT/gpt2m-ptc.log"; }
# Where the time goes: per op kind, from events around each instruction read at the step's end.
$B/ptc-run "$P/gpt2-medium-bf16.plan" --device cuda --data "$P/data.bin" --steps 2 --log-every 0 \
  --profile > "$OUT/gpt2m-profile.txt" 2>&1 || true
$PY bench/gpu_torch_gpt.py --peak-tflops "$PEAK" > "$OUT/gpt2m-torch.json" 2> "$OUT/gpt2m-torch.log" || { status=1; say "gpt2-medium pytorch: FAILED"; tail -5 "$OUT/gpt2m-torch.log"; }
$PY - "$OUT/gpt2m-ptc.jsonl" "$OUT/gpt2m-torch.json" "$PEAK" <<'PY' | tee -a "$SUMMARY"
import json, statistics, sys, os
sys.path.insert(0, "bench")
import common
flops = common.model_flops(24, 1024, 16, 1024, 8, 50257)
peak = float(sys.argv[3]) * 1e12
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
ptc = statistics.median(8 * 1024 / r["tokens_per_s"] for r in rows[3:]) if len(rows) > 3 else None
torch = json.loads(open(sys.argv[2]).read()) if os.path.getsize(sys.argv[2]) else None
print(f"GPT-2 medium (24 x 1024, seq 1024, batch 8, bf16), {flops / 1e12:.1f} TFLOP per step, peak {sys.argv[3]} TFLOP/s:")
if ptc:
    print(f"  ptc-run        step {ptc * 1e3:8.1f} ms  {8192 / ptc:9.0f} tok/s  MFU {flops / ptc / peak:6.1%}"
          f"  (loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} over {len(rows)} steps)")
if torch:
    t = torch["step_s"]
    print(f"  pytorch eager  step {t * 1e3:8.1f} ms  {8192 / t:9.0f} tok/s  MFU {flops / t / peak:6.1%}  (torch {torch['torch']})")
if ptc and torch:
    print(f"  ptc-run / pytorch step time: {ptc / torch['step_s']:.2f}x")
PY
grep -A16 "^profile:" "$OUT/gpt2m-profile.txt" | tee -a "$SUMMARY"
# The step's products one by one (bf16, the Matmul entry as ptc-run calls it).
[ -x $B/ptc-bench-cuda-matmul ] && $B/ptc-bench-cuda-matmul 8192 1024 50257 24 2>&1 | tee -a "$SUMMARY"
fi
say "result: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
