#!/usr/bin/env bash
# GPU check of the CUDA backend, on a machine with an NVIDIA GPU, CUDA 13,
# cmake, ninja and PyTorch but no MLIR, MPI, oneDNN, FlatBuffers headers or
# network. Prepare the carried folder here first:
#   bash bench/gpu_prepare.sh            # writes .gpu-carry/ (git-ignored, ~16 MB)
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
#     grouped-query layer, and f32 attention (the tiled CUDA-core kernels) alone,
#  5. benchmarks training steps with ptc-run and with PyTorch at its best on the same GPU
#     (eager with fused AdamW, and torch.compile; bench/gpu_torch_gpt.py): GPT-2 medium
#     (24 layers, hidden 1024, seq 1024, batch 8, bf16; part bench) and a Llama-style
#     model (16 x 2048, 32 heads / 8 kv heads, intermediate 5632, seq 2048, batch 4,
#     bf16; part llama): step time, tokens/s and MFU (PTC_PEAK_TFLOPS, default 989:
#     H100/H200 dense bf16), the ratio to PyTorch's best, peak GPU memory of each, and
#     ptc-run's time per op kind.
# Results: $OUT/summary.txt (and logs beside it). Exit status: non-zero when a
# kernel test or a loss comparison fails.
# PTC_GPU_CHECK_PARTS (default "kernels losses attention bench llama") picks the parts after the build,
# e.g. PTC_GPU_CHECK_PARTS=kernels to iterate on a failing kernel quickly.
# With this workplace's device tool: run(command="bash bench/gpu_check.sh",
# carry=[".gpu-carry"], timeout_s=540); the build takes a few minutes of it. If
# the build fails there, the binaries gpu_prepare.sh built here are used. All
# parts may not fit one call's 10 minutes (torch.compile compiles each model
# for a minute or two): split them, e.g. PTC_GPU_CHECK_PARTS="kernels losses
# attention bench" in one call and PTC_GPU_CHECK_PARTS=llama in the next on the
# still-warm machine (the build there is kept).
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
# gpu_prepare.sh packs the libraries and the fallback binaries (the carry's size limit).
unpack() { # archive destination
  [ -f "$1" ] || return 0
  tar -xJf "$1" -C "$2" 2>/dev/null ||
    ${PYTHON:-python3} -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2" ||
    { echo "gpu_check: cannot unpack $1" >&2; exit 2; }
}
[ -d "$C/deps/lib" ] || unpack "$C/deps-lib.tar.xz" "$C/deps"
[ -d "$C/bin" ] || unpack "$C/bin.tar.xz" "$C"
export LD_LIBRARY_PATH=$C/deps/lib:${LD_LIBRARY_PATH:-}
PY=${PYTHON:-python3}
PARTS=" ${PTC_GPU_CHECK_PARTS:-kernels losses attention bench llama} "
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
# fp32 plans' attention: the tiled CUDA-core kernels (no tensor cores), same shapes.
$B/ptc-bench-cuda-attention --f32 $SHAPES > "$OUT/attention-ptc-f32.txt" 2>&1 || { status=1; say "ptc-bench-cuda-attention --f32: FAILED"; }
say "f32 attention (the tiled CUDA-core kernels):"
tail -n +3 "$OUT/attention-ptc-f32.txt" | tee -a "$SUMMARY"
$PY - "$OUT/attention-ptc.txt" "$OUT/attention-torch.jsonl" <<'PY' | tee -a "$SUMMARY"
import json, sys
ptc = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 12 and f[1].isdigit():
        ptc[f[0]] = (float(f[6]), float(f[8]), float(f[10]), float(f[11]))
layers = {"gpt2-medium": 24, "llama-gqa": 16}
for line in open(sys.argv[2]):
    t = json.loads(line)
    name = t["name"]
    if "error" in t or name not in ptc:
        print(f"attention {name}: no comparison ({t.get('error', 'ptc did not run it')})")
        continue
    fwd, bwd, both, recomputing = ptc[name]
    n = layers.get(name, 1)
    print(f"attention {name} (x{n} layers): ptc fwd {fwd * n:.2f} ms bwd {bwd * n:.2f} ms "
          f"(recomputing the forward: {recomputing * n:.2f} ms) | torch "
          f"({t['backend']}) fwd {t['fwd_ms'] * n:.2f} ms bwd {t['bwd_ms'] * n:.2f} ms | "
          f"ptc / torch fwd+bwd: {both / t['fwd_bwd_ms']:.2f}x")
PY
fi

# 4. Benchmarks: a training step of ptc-run against PyTorch at its best on the same GPU
# (eager with fused AdamW, and torch.compile), bf16: GPT-2 medium (part bench) and a
# Llama-style model (part llama). compare_step prints both, the ratio to PyTorch's best
# and the peak GPU memory of each (ptc: its tensors, arena and kernel scratch; PyTorch:
# torch.cuda.max_memory_allocated).
compare_step() { # name plan ptc-steps torch-args...
  local name=$1 plan=$2 steps=$3
  shift 3
  $B/ptc-run "$plan" --device cuda --data "$P/data.bin" --steps "$steps" --log-every 1 \
    --metrics "$OUT/$name-ptc.jsonl" --memory-report > "$OUT/$name-ptc.log" 2>&1 || { status=1; say "$name ptc-run: FAILED"; tail -5 "$OUT/$name-ptc.log"; }
  # The same with the biased products on cuBLASLt's bias epilogue (opt-in until checked).
  PTC_CUDA_LT_EPILOGUES=1 $B/ptc-run "$plan" --device cuda --data "$P/data.bin" --steps "$steps" \
    --log-every 1 --metrics "$OUT/$name-ptc-lt.jsonl" > "$OUT/$name-ptc-lt.log" 2>&1 || { status=1; say "$name ptc-run (cuBLASLt epilogues): FAILED"; tail -5 "$OUT/$name-ptc-lt.log"; }
  # Where the time goes: per op kind, from events around each instruction read at the step's end.
  $B/ptc-run "$plan" --device cuda --data "$P/data.bin" --steps 3 --log-every 0 \
    --profile > "$OUT/$name-profile.txt" 2>&1 || true
  for impl in eager compile; do
    local flag=""
    [ $impl = compile ] && flag=--compile
    $PY bench/gpu_torch_gpt.py "$@" $flag --peak-tflops "$PEAK" > "$OUT/$name-torch-$impl.json" \
      2> "$OUT/$name-torch-$impl.log" || { status=1; say "$name pytorch $impl: FAILED"; tail -5 "$OUT/$name-torch-$impl.log"; }
  done
  $PY - "$name" "$OUT" "$PEAK" "$@" <<'PY' | tee -a "$SUMMARY"
import json, os, re, statistics, sys
sys.path.insert(0, "bench")
import common
name, out, peak = sys.argv[1], sys.argv[2], float(sys.argv[3]) * 1e12
args = dict(zip(sys.argv[4::2], sys.argv[5::2]))
get = lambda k, d: int(args.get("--" + k, d))
L, H, A, S, B, V = (get("layers", 24), get("hidden", 1024), get("heads", 16), get("seq", 1024),
                    get("batch", 8), get("vocab", 50257))
if args.get("--arch") == "llama":
    flops = common.model_flops(L, H, A, S, B, V, get("kv-heads", A), get("intermediate", 4 * H))
else:
    flops = common.model_flops(L, H, A, S, B, V)
print(f"{name}: {' '.join(sys.argv[4:])}, {flops / 1e12:.1f} TFLOP per step, peak {peak / 1e12:.0f} TFLOP/s")
log = os.path.join(out, f"{name}-ptc.jsonl")
rows = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
ptc = statistics.median(B * S / r["tokens_per_s"] for r in rows[3:]) if len(rows) > 3 else None
mem = None
if os.path.exists(os.path.join(out, f"{name}-ptc.log")):
    text = open(os.path.join(out, f"{name}-ptc.log")).read()
    m = re.search(r"allocated \+ scratch (\d+) B", text) or re.search(r"allocated (\d+) B", text)
    mem = int(m.group(1)) if m else None
best = None
for impl in ("eager", "compile"):
    f = os.path.join(out, f"{name}-torch-{impl}.json")
    if os.path.exists(f) and os.path.getsize(f):
        t = json.loads(open(f).read().strip().splitlines()[-1])
        print(f"  pytorch {impl:8s} step {t['step_s'] * 1e3:8.1f} ms  {B * S / t['step_s']:9.0f} tok/s"
              f"  MFU {flops / t['step_s'] / peak:6.1%}  peak memory {t['peak_bytes'] / 2**30:6.2f} GiB"
              f"  (torch {t['torch']})")
        if best is None or t["step_s"] < best[1]["step_s"]:
            best = (impl, t)
if ptc:
    print(f"  ptc-run          step {ptc * 1e3:8.1f} ms  {B * S / ptc:9.0f} tok/s  MFU {flops / ptc / peak:6.1%}"
          + (f"  peak memory {mem / 2**30:6.2f} GiB" if mem else "")
          + f"  (loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} over {len(rows)} steps)")
lt = os.path.join(out, f"{name}-ptc-lt.jsonl")
lrows = [json.loads(l) for l in open(lt)] if os.path.exists(lt) else []
if len(lrows) > 3:
    t = statistics.median(B * S / r["tokens_per_s"] for r in lrows[3:])
    print(f"  ptc-run, bias epilogues on cuBLASLt (PTC_CUDA_LT_EPILOGUES=1): step {t * 1e3:8.1f} ms"
          f"  (loss {lrows[0]['loss']:.4f} -> {lrows[-1]['loss']:.4f})")
if ptc and best:
    print(f"  ptc-run / pytorch {best[0]} (the best): {ptc / best[1]['step_s']:.2f}x step time"
          + (f", {mem / best[1]['peak_bytes']:.2f}x peak memory" if mem else ""))
PY
  grep -A20 "^profile:" "$OUT/$name-profile.txt" | tee -a "$SUMMARY"
}
if part bench; then
  compare_step gpt2-medium "$P/gpt2-medium-bf16.plan" 8 --arch gpt --layers 24 --hidden 1024 \
    --heads 16 --seq 1024 --vocab 50257 --batch 8
  # The step's products one by one (bf16, the Matmul entry as ptc-run calls it).
  [ -x $B/ptc-bench-cuda-matmul ] && $B/ptc-bench-cuda-matmul 8192 1024 50257 24 2>&1 | tee -a "$SUMMARY"
fi
if part llama; then
  compare_step llama "$P/llama-bf16.plan" 8 --arch llama --layers 16 --hidden 2048 --heads 32 \
    --kv-heads 8 --intermediate 5632 --seq 2048 --vocab 32000 --batch 4
fi
say "result: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
