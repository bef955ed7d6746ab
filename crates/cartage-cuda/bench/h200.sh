#!/usr/bin/env bash
# One call on the GPU machine, from the repository root, after
#   STAGE_SUFFIX=cuda STAGE_FEATURES="" /work/gpu-tools/stage -p cartage-cuda
# Usage: bash crates/cartage-cuda/bench/h200.sh [env] [tests] [sanitize] [bench] [quick]
# Logs and tables go to $OUT (or ./gpu-out when OUT is unset).
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
steps=" $* "
stage=.gpu-cuda
[ -d $stage/bin ] || tar xzf $stage/bin.tgz -C $stage
export CARTAGE_REQUIRE=cuda RUST_BACKTRACE=1

# CUDA libraries: the backend looks on the loader path and in /usr/local/cuda; report both.
if ! ldconfig -p | grep -q 'libnvrtc.so'; then
  for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))' 2>/dev/null)/cu13/lib; do
    [ -e "$d/libnvrtc.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
  done
fi

if [[ $steps == *" env "* ]]; then
  echo "== env"
  nvidia-smi -L
  ldconfig -p | grep -E 'libnvrtc|libcublas|libcuda\.so' | head -8
  ls /usr/local/cuda/lib64 2>/dev/null | grep -E '^lib(nvrtc|cublas)' | head -8
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  command -v compute-sanitizer
fi

bin_of() { ls $stage/bin/$1-* 2>/dev/null | head -1; }

if [[ $steps == *" tests "* ]]; then
  echo "== tests"
  for t in cartage_cuda conformance cuda_backend; do
    b=$(bin_of $t)
    echo "--- $t ($b)"
    (cd crates/cartage-cuda && timeout 300 ../../$b --test-threads=8 2>&1) | tee "$out/test-$t.log" |
      grep -E 'SKIP|FAILED|panicked|failures:|test result|error|cuda devices|matmul relative|child:|on the device' | head -60
  done
fi

if [[ $steps == *" seeds "* ]]; then
  echo "== conformance under 8 more random seeds"
  b=$(bin_of conformance)
  for i in 1 2 3 4 5 6 7 8; do
    (cd crates/cartage-cuda && ../../$b --test-threads=8 2>&1) | grep -E 'test result|FAIL ' | head -4
  done
fi

if [[ $steps == *" bench "* ]]; then
  q=""; [[ $steps == *" quick "* ]] && q="--quick"
  echo "== bench"
  # The kernel timings are `cargo xtask kernels cuda`: the staged xtask binary (stage `-p xtask` too).
  timeout 240 $stage/bin/xtask kernels cuda $q > "$out/cartage.tsv" 2> "$out/cartage.err"; echo "kernels cuda exit $?"
  tail -3 "$out/cartage.err"
  PYTHONUNBUFFERED=1 timeout 240 python3 crates/cartage-cuda/bench/torch_bench.py $q > "$out/torch.tsv" 2> "$out/torch.err"
  echo "torch_bench exit $?"; tail -2 "$out/torch.err"
  python3 crates/cartage-cuda/bench/compare.py "$out/cartage.tsv" "$out/torch.tsv" | tee "$out/compare.txt"
fi

if [[ $steps == *" sanitize "* ]]; then
  echo "== compute-sanitizer memcheck (conformance)"
  b=$(bin_of conformance)
  (cd crates/cartage-cuda && timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool memcheck --error-exitcode 9 \
    ../../$b --test-threads=4 2>&1) > "$out/sanitize.log"
  echo "exit $?"
  grep -E 'ERROR SUMMARY|Invalid|test result|FAILED' "$out/sanitize.log" | head -20
fi

