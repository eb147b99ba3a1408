#!/usr/bin/env bash
# Builds the libFuzzer targets and the runtime's unit tests (runtime only, with
# AddressSanitizer and UndefinedBehaviorSanitizer) in build-fuzz/, makes a seed
# corpus from real plans, weights and checkpoints (with the main build's
# tools), and runs each target.
#   bash scripts/fuzz.sh [RUNS per target (default 500000)]
#   bash scripts/fuzz.sh --ci     # as the test command runs it: the sanitized unit
#                                 # tests, then each target for 20 s
# Crashes are written to build-fuzz/crashes/<target>/ and the script fails;
# keep each as a regression input in test/fuzz/regressions/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
CI=0
if [ "${1:-}" = "--ci" ]; then CI=1; shift; fi
RUNS=${1:-500000}
START=$(date +%s)
[ "$CI" = 1 ] || bash scripts/setup.sh >/dev/null   # the compiler and runtime that make the seeds
if ! dpkg-query -W -f='${Status}' libclang-rt-22-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends libclang-rt-22-dev
fi
cmake -G Ninja -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
  -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
  -DPTC_BUILD_COMPILER=OFF -DPTC_BUILD_TESTS=ON -DPTC_ENABLE_CUDA=OFF -DPTC_WITH_MPI=OFF \
  -DPTC_FUZZERS=ON >/dev/null
cmake --build build-fuzz --target ptc-fuzz-plan ptc-fuzz-safetensors ptc-fuzz-checkpoint \
  ptc-fuzz-tokens ptc-runtime-tests ptc-device-tests
BUILT=$(date +%s)
# The runtime's unit tests under the sanitizers (the CPU device; no GPU here).
ASAN_OPTIONS=detect_leaks=1 build-fuzz/test/ptc-runtime-tests --gtest_brief=1
ASAN_OPTIONS=detect_leaks=1 build-fuzz/test/ptc-device-tests --gtest_brief=1

B=${PTC_BUILD_DIR:-build}/bin
SEEDS=build-fuzz/seeds
mkdir -p $SEEDS/plan $SEEDS/safetensors $SEEDS/checkpoint $SEEDS/tokens
$B/ptc-model gpt --layers 2 --hidden 16 --heads 2 --seq 8 --vocab 256 --batch 4 -o $SEEDS/gpt.mlir
for opts in "" "mesh=dp:2" "mesh=tp:2 sequence-parallel=true" "mesh=dp:2 zero=3" \
            "mesh=pp:2 microbatches=2" "precision=bf16 dynamic-loss-scale=true" "optimizer=sgd max-grad-norm=1" \
            "precision=bf16 mesh=dp:2 zero=1 offload=optimizer"; do
  name=$(printf '%s' "$opts" | tr -c 'a-z0-9' '_')
  $B/ptc-opt $SEEDS/gpt.mlir --ptc-compile="plan=$SEEDS/plan/gpt$name.plan $opts" -o /dev/null
done
$B/ptc-model moe --batch 8 -o $SEEDS/moe.mlir
$B/ptc-opt $SEEDS/moe.mlir --ptc-compile="plan=$SEEDS/plan/moe.plan" -o /dev/null
$B/ptc-tokenize -o $SEEDS/data.bin /usr/share/common-licenses/GPL-3 >/dev/null
$B/ptc-run $SEEDS/plan/gpt.plan --data $SEEDS/data.bin --steps 1 --log-every 0 \
  --save $SEEDS/safetensors/gpt.safetensors >/dev/null
# Checkpoint metadata: a real one, and one shaped for the fuzzer's own shard.
rm -rf $SEEDS/ckpt && $B/ptc-run $SEEDS/plan/gpt.plan --data $SEEDS/data.bin --steps 1 \
  --log-every 0 --checkpoint-dir $SEEDS/ckpt >/dev/null
cp $SEEDS/ckpt/step-00000001/metadata.json $SEEDS/checkpoint/real.json
cat > $SEEDS/checkpoint/small.json <<'JSON'
{"format":"ptc-distributed-checkpoint","version":1,"step":3,"info":{"optimizer":"adamw"},
 "tensors":{"w":{"kind":"parameter","dtype":"F32","shape":[5,4]}},
 "boxes":[{"tensor":"w","file":"rank-00000.safetensors","key":"w","offset":[0,0],"shape":[3,4]},
          {"tensor":"w","file":"rank-00000.safetensors","key":"w#1","offset":[3,0],"shape":[2,2]}],
 "files":{"rank-00000.safetensors":"@@@@@@@@@@@@@@@@"}}
JSON
head -c 4096 $SEEDS/data.bin > $SEEDS/tokens/text.bin
printf '{"metadata":{"total_size":24},"weight_map":{"w":"model-00001-of-00001.safetensors"}}' \
  > $SEEDS/tokens/index.json

status=0
for target in plan safetensors checkpoint tokens; do
  corpus=build-fuzz/corpus/$target
  mkdir -p "$corpus" build-fuzz/crashes/$target
  regressions=test/fuzz/regressions/$target
  inputs=("$corpus" "$SEEDS/$target")
  [ -d "$regressions" ] && inputs+=("$regressions")
  echo "ptc fuzz: $target, $([ "$CI" = 1 ] && echo "20 s" || echo "$RUNS runs")"
  limit=(-runs="$RUNS")
  [ "$CI" = 1 ] && limit=(-max_total_time=20)
  if ! build-fuzz/bin/ptc-fuzz-$target "${limit[@]}" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
       -artifact_prefix=build-fuzz/crashes/$target/ -print_final_stats=1 "${inputs[@]}" \
       2> build-fuzz/$target.log; then
    status=1
    # What failed (a crash, a sanitizer report, a leak, a timeout, the memory
    # limit) and the input that did it, so a CI log alone says what to fix.
    echo "ptc fuzz: $target FAILED:"
    grep -E "ERROR|SUMMARY|Test unit written|timeout|out-of-memory|^ +#[0-9]+ 0x" \
      build-fuzz/$target.log | head -40 || true
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+[[:space:]]+DONE" \
    build-fuzz/$target.log | sort -u || true
done
END=$(date +%s)
echo "ptc fuzz: sanitized build + unit tests $((BUILT - START)) s, fuzzing $((END - BUILT)) s"
exit $status
