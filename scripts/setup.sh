#!/usr/bin/env bash
# Installs ptc's dependencies (Debian 12 packages), configures and builds it.
# Safe to re-run: it installs only what is missing and rebuilds incrementally.
#   PTC_BUILD_DIR  build folder (default: ./build)
#   PTC_TARGETS    ninja targets to build (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools          # compiler (MLIR 22, lit, FileCheck)
  flatbuffers-compiler libflatbuffers-dev flatbuffers-compiler-dev # plan format
  openmpi-bin libopenmpi-dev                                      # launcher, CPU collectives
  libdnnl-dev libomp-22-dev                                       # CPU GEMMs (oneDNN), kernel threads
  libopenblas-dev                                                 # CPU gradient GEMMs without AVX-512 (OpenBLAS)
  nlohmann-json3-dev                                              # safetensors headers, metrics
  libtomlplusplus-dev                                             # ptc-train job files
  libsentencepiece-dev python3-sentencepiece                      # ptc-tokenize (and its check)
  slurm-wlm munge                                                 # Slurm tests (a local cluster)
  libgtest-dev cmake ninja-build ccache clang-22 lld-22 g++        # build and unit tests
  libclang-rt-22-dev                                              # sanitizers and libFuzzer (CI)
  python3-numpy python3-torch                                     # reference numerics in tests
  python3-yaml                                                    # scripts/check-mpijob.py
  python3-matplotlib                                              # plots of bench/scaling.py
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ptc setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${PTC_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake_args=(-G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
              -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir)
  if command -v clang++-22 >/dev/null && command -v ld.lld >/dev/null; then
    # clang-22 + lld link MLIR tools in a fraction of the time of g++ + ld.
    cmake_args+=(-DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22
                 -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld)
  fi
  cmake "${cmake_args[@]}"
fi
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -- ${PTC_TARGETS:-}
