#!/usr/bin/env bash
# Prepares .gpu-carry/ (git-ignored) for bench/gpu_check.sh on a GPU machine
# that has CUDA, cmake, ninja and PyTorch but no MLIR, MPI, oneDNN,
# FlatBuffers headers or GoogleTest, and no network:
#   deps/include  FlatBuffers, nlohmann/json, oneDNN headers and the
#                 generated plan header (runtime/plan/plan_generated.h)
#   deps/lib      libdnnl (+ libgomp, libOpenCL it links) for the CPU kernels' GEMMs
#                 (without OpenBLAS, whose 35 MB would not fit the carry: built with
#                 -DPTC_WITH_OPENBLAS=OFF, every f32 GEMM on oneDNN)
#   deps/googletest  GoogleTest sources (built there)
#   bin/          the same runtime built here (no MPI, sm_80 + sm_90), in case the build
#                 there fails: ptc-run, ptc-bench-cuda-attention, ptc-device-tests, stripped
#                 (+ libomp in deps/lib; cuDNN comes from the GPU machine; the carry and
#                 the sources must stay under the device tool's 64 MiB)
#   plans/        plans compiled here: the standard GPT (fp32, bf16, bf16 offloaded), a
#                 GPT-2-medium-sized and a Llama-style bf16 model; the token data; the CPU
#                 backend's losses for the standard GPT (the GPU must match them)
# Usage: bash bench/gpu_prepare.sh   (after bash scripts/setup.sh; ~2 min)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PTC_BUILD_DIR:-build}/bin
C=.gpu-carry
STEPS=${PTC_GPU_CHECK_STEPS:-50}
rm -rf "$C" && mkdir -p "$C/deps/include/runtime/plan" "$C/deps/lib" "$C/plans"
ninja -C "${PTC_BUILD_DIR:-build}" ptc-opt ptc-model ptc-run ptc-tokenize >/dev/null

cp -r /usr/include/flatbuffers /usr/include/nlohmann "$C/deps/include/"
cp -r /usr/include/oneapi "$C/deps/include/"
cp "${PTC_BUILD_DIR:-build}/runtime/plan/plan_generated.h" "$C/deps/include/runtime/plan/"
for lib in libdnnl.so.2 libgomp.so.1 libOpenCL.so.1; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" "$C/deps/lib/"
done
ln -s libdnnl.so.2 "$C/deps/lib/libdnnl.so"
cp -r /usr/src/googletest "$C/deps/googletest"

# Fallback binaries: a runtime-only build without MPI (CUDA, cuBLAS and NCCL come
# from the GPU machine's CUDA 13).
cmake -S . -B build-gpu-carry -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTC_BUILD_COMPILER=OFF \
  -DPTC_WITH_MPI=OFF -DPTC_WITH_OPENBLAS=OFF -DCMAKE_CXX_COMPILER=clang++-22 -DCMAKE_C_COMPILER=clang-22 \
  -DPTC_CPU_ARCH=x86-64-v3 >/dev/null
ninja -C build-gpu-carry ptc-run ptc-device-tests ptc-bench-cuda-attention >/dev/null
mkdir -p "$C/bin"
cp build-gpu-carry/bin/ptc-run build-gpu-carry/bin/ptc-bench-cuda-attention \
  build-gpu-carry/test/ptc-device-tests "$C/bin/"
strip "$C"/bin/*
cp -L /usr/lib/x86_64-linux-gnu/libomp.so.5 "$C/deps/lib/"

P=$C/plans
"$BIN/ptc-tokenize" -o "$P/data.bin" /usr/share/common-licenses/GPL-3 >/dev/null
# The standard GPT of scripts/main.sh on one device, fp32 and bf16.
OPTS="optimizer=adamw lr=1e-3 beta2=0.95 weight-decay=0.1 max-grad-norm=1.0"
"$BIN/ptc-model" gpt --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 256 --batch 8 -o "$P/gpt.mlir"
"$BIN/ptc-opt" "$P/gpt.mlir" --ptc-compile="plan=$P/gpt-fp32.plan $OPTS" -o /dev/null
"$BIN/ptc-opt" "$P/gpt.mlir" --ptc-compile="plan=$P/gpt-bf16.plan $OPTS precision=bf16" -o /dev/null
# The same with the optimizer offloaded to host memory (master weights, AdamW on the host CPU).
"$BIN/ptc-opt" "$P/gpt.mlir" --ptc-compile="plan=$P/gpt-bf16off.plan $OPTS precision=bf16 offload=optimizer" -o /dev/null
for p in fp32 bf16 bf16off; do
  "$BIN/ptc-run" "$P/gpt-$p.plan" --device cpu --data "$P/data.bin" --steps "$STEPS" --log-every 0 \
    --metrics "$P/cpu-$p.jsonl" >/dev/null
done
# GPT-2 medium (24 layers, hidden 1024, 16 heads, seq 1024, vocab 50257), batch 8, bf16.
"$BIN/ptc-model" gpt --layers 24 --hidden 1024 --heads 16 --seq 1024 --vocab 50257 --batch 8 \
  -o "$P/gpt2-medium.mlir"
"$BIN/ptc-opt" "$P/gpt2-medium.mlir" \
  --ptc-compile="plan=$P/gpt2-medium-bf16.plan optimizer=adamw lr=1e-4 precision=bf16" -o /dev/null
# The Llama-style model of gpu_check.sh's part llama: 16 layers, hidden 2048, 32 heads / 8
# kv heads, SwiGLU 5632, seq 2048, vocab 32000, batch 4, bf16.
"$BIN/ptc-model" llama --layers 16 --hidden 2048 --heads 32 --kv-heads 8 --intermediate 5632 \
  --seq 2048 --vocab 32000 --batch 4 -o "$P/llama.mlir"
"$BIN/ptc-opt" "$P/llama.mlir" \
  --ptc-compile="plan=$P/llama-bf16.plan optimizer=adamw lr=1e-4 precision=bf16" -o /dev/null
rm "$P"/*.mlir
# The libraries and fallback binaries travel compressed (~65 MB -> ~9 MB: the
# carry and the sources must stay under the device tool's 64 MiB);
# gpu_check.sh unpacks them.
tar -cJf "$C/deps-lib.tar.xz" -C "$C/deps" lib && rm -rf "$C/deps/lib"
tar -cJf "$C/bin.tar.xz" -C "$C" bin && rm -rf "$C/bin"
du -sh "$C"
