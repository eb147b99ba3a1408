#!/usr/bin/env bash
# Builds the libFuzzer targets and the runtime's unit tests (runtime only, with
# AddressSanitizer and UndefinedBehaviorSanitizer) in build-fuzz/, makes a seed
# corpus from real plans, weights and checkpoints (with the main build's
# tools), and runs each target.
#   bash scripts/fuzz.sh                     # the deterministic check (set-up first)
#   bash scripts/fuzz.sh --ci                # the same, as the test command runs it:
#                                            # the sanitized unit tests, then per target
#                                            # every regression input and seed, then a
#                                            # fixed -seed with a fixed -runs budget
#   bash scripts/fuzz.sh --campaign SECONDS [TARGET...]
#                                            # a long search: each target (default all,
#                                            # mlir included) SECONDS from a random seed,
#                                            # growing the corpus in build-fuzz/corpus/
# Targets: plan, safetensors, checkpoint, tokens (the runtime's readers, in a
# runtime-only build) and mlir (model text through ptc-compile in process, in
# a sanitized build of the compiler of its own, build-fuzz-mlir/; named, or by
# default in a campaign: its build takes a quarter of an hour on 2 cores).
# The deterministic check gives the same result on the same commit: it starts
# from an empty corpus each time and nothing in it depends on the clock.
# A crash in either mode fails the script and is written to
# build-fuzz/crashes/<target>/; a campaign also copies each finding to
# test/fuzz/regressions/<target>/ (named by its SHA-1), where the deterministic
# check replays it from then on: commit it with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=check
CAMPAIGN_SECONDS=0
TARGETS=(plan safetensors checkpoint tokens)
case "${1:-}" in
  --ci) MODE=ci; shift ;;
  --campaign)
    MODE=campaign
    CAMPAIGN_SECONDS=${2:-}
    if ! [[ "$CAMPAIGN_SECONDS" =~ ^[1-9][0-9]*$ ]]; then
      echo "ptc fuzz: --campaign needs a number of seconds per target, got '${CAMPAIGN_SECONDS}'" >&2
      exit 2
    fi
    shift 2
    TARGETS+=(mlir)
    if (($#)); then TARGETS=("$@"); fi ;;
  "") ;;
  *) echo "ptc fuzz: unknown argument '$1' (use --ci or --campaign SECONDS [TARGET...])" >&2; exit 2 ;;
esac
for target in "${TARGETS[@]}"; do
  case "$target" in plan|safetensors|checkpoint|tokens|mlir) ;;
    *) echo "ptc fuzz: unknown target '$target' (plan, safetensors, checkpoint, tokens, mlir)" >&2; exit 2 ;;
  esac
done
WITH_MLIR=0
for target in "${TARGETS[@]}"; do [ "$target" = mlir ] && WITH_MLIR=1; done
# The deterministic budget: a fixed seed and a fixed number of executions per
# target (about 15-20 s each on one core of this 2-core machine).
SEED=20261201
declare -A RUNS=([plan]=80000 [safetensors]=100000 [checkpoint]=25000 [tokens]=30000 [mlir]=300)
START=$(date +%s)
[ "$MODE" = ci ] || bash scripts/setup.sh >/dev/null   # the compiler and runtime that make the seeds
if ! dpkg-query -W -f='${Status}' libclang-rt-22-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends libclang-rt-22-dev
fi
SANITIZED=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22
  -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -ffile-prefix-map=$PWD=."
  -DPTC_ENABLE_CUDA=OFF -DPTC_WITH_MPI=OFF -DPTC_FUZZERS=ON)
cmake -S . -B build-fuzz "${SANITIZED[@]}" -DPTC_BUILD_COMPILER=OFF -DPTC_BUILD_TESTS=ON >/dev/null
cmake --build build-fuzz --target ptc-fuzz-plan ptc-fuzz-safetensors ptc-fuzz-checkpoint \
  ptc-fuzz-tokens ptc-runtime-tests ptc-device-tests
# The runtime's unit tests under the sanitizers (the CPU device; no GPU here).
ASAN_OPTIONS=detect_leaks=1 build-fuzz/test/ptc-runtime-tests --gtest_brief=1
ASAN_OPTIONS=detect_leaks=1 build-fuzz/test/ptc-device-tests --gtest_brief=1
if ((WITH_MLIR)); then
  cmake -S . -B build-fuzz-mlir "${SANITIZED[@]}" -DPTC_BUILD_COMPILER=ON -DPTC_BUILD_TESTS=OFF \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir >/dev/null
  cmake --build build-fuzz-mlir --target ptc-fuzz-mlir
  cp build-fuzz-mlir/bin/ptc-fuzz-mlir build-fuzz/bin/
fi
BUILT=$(date +%s)

B=${PTC_BUILD_DIR:-build}/bin
SEEDS=build-fuzz/seeds
rm -rf $SEEDS && mkdir -p $SEEDS/plan $SEEDS/safetensors $SEEDS/checkpoint $SEEDS/tokens $SEEDS/mlir
$B/ptc-model gpt --layers 2 --hidden 16 --heads 2 --seq 8 --vocab 256 --batch 4 -o $SEEDS/gpt.mlir
for opts in "" "mesh=dp:2" "mesh=tp:2 sequence-parallel=true" "mesh=dp:2 zero=3" \
            "mesh=pp:2 microbatches=2" "precision=bf16 dynamic-loss-scale=true" "optimizer=sgd max-grad-norm=1" \
            "precision=bf16 mesh=dp:2 zero=1 offload=optimizer"; do
  name=$(printf '%s' "$opts" | tr -c 'a-z0-9' '_')
  $B/ptc-opt $SEEDS/gpt.mlir --ptc-compile="plan=$SEEDS/plan/gpt$name.plan $opts" -o /dev/null
done
$B/ptc-model moe --batch 8 -o $SEEDS/moe.mlir
$B/ptc-opt $SEEDS/moe.mlir --ptc-compile="plan=$SEEDS/plan/moe.plan" -o /dev/null
# Model text for the compiler's front door, each with the compile options of
# its first line (the mlir target reads them from there).
$B/ptc-model llama --layers 2 --hidden 16 --heads 2 --kv-heads 1 --intermediate 32 --seq 8 --vocab 64 \
  --batch 4 -o $SEEDS/llama.mlir
seed_mlir() { { echo "// ptc-compile: $2"; cat "$1"; } > "$SEEDS/mlir/$3"; }
seed_mlir $SEEDS/gpt.mlir "" gpt.mlir
seed_mlir $SEEDS/gpt.mlir "mesh=dp:2,tp:2 sequence-parallel=true zero=1" gpt-dp-tp.mlir
seed_mlir $SEEDS/gpt.mlir "mesh=pp:2 microbatches=2 schedule=1f1b precision=bf16" gpt-pp.mlir
seed_mlir $SEEDS/gpt.mlir "mesh=cp:2 cp-attention=ulysses recompute=full" gpt-cp.mlir
seed_mlir $SEEDS/llama.mlir "mesh=dp:2 zero=3 optimizer=sgd max-grad-norm=1" llama-z3.mlir
$B/ptc-model llama --layers 1 --hidden 16 --heads 2 --intermediate 24 --seq 8 --vocab 64 --batch 4 \
  --moe-experts 4 -o $SEEDS/llama-moe.mlir
seed_mlir $SEEDS/llama-moe.mlir "mesh=ep:2" moe-ep.mlir
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
head -c 1000 /usr/share/common-licenses/GPL-3 > $SEEDS/text.txt
$B/ptc-tokenize --dtype uint32 -o $SEEDS/tokens/wide.bin $SEEDS/text.txt >/dev/null   # with a header
printf '{"metadata":{"total_size":24},"weight_map":{"w":"model-00001-of-00001.safetensors"}}' \
  > $SEEDS/tokens/index.json

# The deterministic runs (-ffile-prefix-map above keeps most of the clone's
# path out of the binaries; the sanitizers' source locations still hold it):
# in a fixed, minimal environment (without address
# randomisation the stack's addresses still move with the environment's size:
# PWD, ...), and without address randomisation where the kernel allows it.
LAUNCH=()
if [ "$MODE" != campaign ]; then
  LAUNCH=(env -i PATH=/usr/bin:/bin)
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    LAUNCH+=(setarch "$(uname -m)" -R)
  else
    echo "ptc fuzz: warning: cannot turn off address randomisation (setarch -R); the fixed-seed" \
         "runs may explore differently from run to run"
  fi
fi
status=0
for target in "${TARGETS[@]}"; do
  mkdir -p build-fuzz/crashes/$target
  regressions=test/fuzz/regressions/$target
  # A compile of a small model takes tens of milliseconds; 30 s is a hang.
  timeout=10; [ "$target" = mlir ] && timeout=30
  common=(-max_len=65536 -timeout=$timeout -rss_limit_mb=4096 -artifact_prefix=build-fuzz/crashes/$target/
          -print_final_stats=1)
  if [ "$MODE" = campaign ]; then
    corpus=build-fuzz/corpus/$target
    mkdir -p "$corpus"
    inputs=("$corpus" "$SEEDS/$target")
    [ -d "$regressions" ] && inputs+=("$regressions")
    echo "ptc fuzz: $target, campaign of $CAMPAIGN_SECONDS s from a random seed"
    args=(-max_total_time="$CAMPAIGN_SECONDS" "${inputs[@]}")
  else
    # A fresh corpus each time: the seeds and regression inputs are read-only
    # corpus folders, what the run finds goes to the first one.
    corpus=build-fuzz/ci-corpus/$target
    rm -rf "$corpus" && mkdir -p "$corpus"
    inputs=("$corpus" "$SEEDS/$target")
    [ -d "$regressions" ] && inputs+=("$regressions")
    echo "ptc fuzz: $target, regression inputs, seeds, then seed $SEED for ${RUNS[$target]} runs"
    # -reload=0: no periodic re-read of the corpus folder (a clock-driven
    # event); the launcher (LAUNCH) without address randomisation: the
    # comparison operands libFuzzer learns from include pointers.
    args=(-seed=$SEED -runs="${RUNS[$target]}" -reload=0 "${inputs[@]}")
  fi
  before=$(ls build-fuzz/crashes/$target | wc -l)
  # The compiler's target calls into MLIR's own (uninstrumented) library: its
  # std containers and LLVM's bump allocator, whose headers poison and unpoison
  # slabs only where they are compiled with ASan, give false reports
  # (container-overflow, use-after-poison) unless those annotations are off.
  asan=()
  [ "$target" = mlir ] && asan=(env ASAN_OPTIONS=detect_container_overflow=0:allow_user_poisoning=0)
  if ! "${LAUNCH[@]}" "${asan[@]}" build-fuzz/bin/ptc-fuzz-$target "${common[@]}" "${args[@]}" \
       2> build-fuzz/$target.log; then
    status=1
    # What failed (a crash, a sanitizer report, a leak, a timeout, the memory
    # limit) and the input that did it, so a CI log alone says what to fix.
    echo "ptc fuzz: $target FAILED:"
    grep -a -E "ERROR|SUMMARY|Test unit written|timeout|out-of-memory|^ +#[0-9]+ 0x" \
      build-fuzz/$target.log | head -40 || true
    if [ "$MODE" = campaign ] && [ "$(ls build-fuzz/crashes/$target | wc -l)" -gt "$before" ]; then
      mkdir -p "$regressions"
      for f in build-fuzz/crashes/$target/*; do
        kept=$regressions/campaign-$(sha1sum "$f" | cut -c1-16)
        [ -e "$kept" ] || { cp "$f" "$kept"; echo "ptc fuzz: kept $f as $kept"; }
      done
    fi
  fi
  grep -a -E "stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+[[:space:]]+DONE" \
    build-fuzz/$target.log | sort -u || true
done
END=$(date +%s)
echo "ptc fuzz: sanitized build + unit tests $((BUILT - START)) s, seeds + fuzzing $((END - BUILT)) s"
exit $status
