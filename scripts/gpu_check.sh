#!/usr/bin/env bash
# The GPU suite and the side-by-side replay against the anchors, on a machine
# with an NVIDIA GPU. Usage: bash scripts/gpu_check.sh [OUTDIR]
#   VRAMKIT_GTEST_SOURCE_DIR  GoogleTest sources when it is not installed
#   VRAMKIT_TRACE_DIR         *.trace.csv or *.trace.csv.gz files for the anchors' harness
#   VRAMKIT_ANCHORS_DIR       the anchors' harness (anchors.py, replay_cuda.cu)
#   VRAMKIT_GPU_BENCH         comma-separated GPU benchmarks to run after the tests:
#                             quant, emul (needs VRAMKIT_TRACE_DIR), checkpoint, e2e, access
#                             (each takes minutes: split them over calls of a time-limited machine),
#                             quant_variants (below)
#   VRAMKIT_QUANT_VARIANTS    with quant_variants: builds of the kernels to time beside the
#                             installed ones, ';'-separated, each a set of nvcc flags, e.g.
#                             "-DVK_QUANT_ENC_CONTIG=8;-DVK_QUANT_ENC_CONTIG=4". Each is built by
#                             CMake (the target's own flags plus these), put in the package's place
#                             for the GPU quantization tests and quant_bench.py --no-model, and the
#                             installed kernels are put back (also when the script is stopped)
#   VRAMKIT_GPU_TESTS=0       skip the build and the tests (benchmarks only)
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
out=${1:-build/gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if [ "${VRAMKIT_GPU_TESTS:-1}" = 1 ]; then
echo "== build (C++ core, tests, replay bench)"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMKIT_CUDA=ON -DVRAMKIT_KERNELS=OFF \
  ${VRAMKIT_GTEST_SOURCE_DIR:+-DVRAMKIT_GTEST_SOURCE_DIR=$VRAMKIT_GTEST_SOURCE_DIR} >"$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
cmake --build build/gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -20; exit 1; }
echo "== C++ tests on the GPU (cuda, cuda_async, vmm and the pool over each)"
./build/gpu/cpp/tests/vramkit_tests >"$out/cpp-tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED" "$out/cpp-tests.log" | head -40
echo "== compute-sanitizer memcheck (leak check) on the CUDA conformance tests"
# The out-of-memory tests provoke CUDA API errors on purpose: not reported, so
# that any error left (an invalid access, a leak) fails the run.
compute-sanitizer --tool memcheck --leak-check full --report-api-errors no --error-exitcode 9 \
  ./build/gpu/cpp/tests/vramkit_tests --gtest_filter='*cuda*:*vmm*' >"$out/memcheck.log" 2>&1
mc=$?
echo "memcheck exit code $mc: $(grep 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
[ $mc -eq 0 ] || status=1
echo "== what the page device's calls cost (cuMemCreate/Map/SetAccess/Unmap/Release)"
./build/gpu/cpp/bench/vramkit_page_cost --device vmm --pages 256 --threads 1,2,4 2>&1 | tee "$out/page-cost.txt"
if [ -x ./build/gpu/cpp/bench/vramkit_vmm_overlap ]; then
  echo "== whether page calls on a helper thread hold up launches or wait for queued GPU work (map_ahead)"
  ./build/gpu/cpp/bench/vramkit_vmm_overlap --launches 20000 --pages 256 --repeat 3 2>&1 | tee "$out/vmm-overlap.txt"
fi
if [ "${VRAMKIT_GPU_PYTHON:-1}" = 1 ]; then
  echo "== Python GPU tests (pytest -m gpu): PyTorch, CuPy, Numba, interop, leaks, guard zones"
  python3 -m pip install -q --no-build-isolation . >"$out/pip.log" 2>&1 || { tail -20 "$out/pip.log"; exit 1; }
  python3 -m pytest -m gpu python/tests -q -rsxf -p no:cacheprovider >"$out/pytest-gpu.log" 2>&1
  rc=$?
  grep -E "passed|failed|error" "$out/pytest-gpu.log" | tail -3
  [ $rc -eq 0 ] || { grep -E "^(FAILED|ERROR)" "$out/pytest-gpu.log" | head -20; status=1; }
fi
fi
bench=",${VRAMKIT_GPU_BENCH:-},"
if [ "$bench" != ",," ]; then
  python3 -c "import vramkit" 2>/dev/null || python3 -m pip install -q --no-build-isolation . >"$out/pip.log" 2>&1 \
    || { tail -20 "$out/pip.log"; exit 1; }
fi
if [[ $bench == *,quant,* ]]; then
  echo "== quantization kernels against the device's copy bandwidth"
  python3 benchmarks/quant_bench.py --out "$out/quant_bench.json" 2>&1 | tee "$out/quant-bench.txt" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ $bench == *,quant_variants,* ]]; then
  echo "== quantization kernels: the installed build and each of VRAMKIT_QUANT_VARIANTS, one call"
  pkg=$(python3 -c 'import os, vramkit; print(os.path.dirname(vramkit.__file__))')
  lib="$pkg/libvramkit_kernels.so"
  if [ ! -f "$lib" ]; then
    echo "no $lib: the package was built without the kernels"; status=1
  else
    cp "$lib" "$out/kernels-installed.so.keep"
    trap 'cp "$out/kernels-installed.so.keep" "$lib"' EXIT
    python3 benchmarks/quant_bench.py --no-model 2>&1 | tee "$out/quant-variant-0.txt" | tail -60
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    IFS=';' read -ra variants <<<"${VRAMKIT_QUANT_VARIANTS:-}"
    # One compiler process per build (quant.cu is one unit): all variants at once.
    i=0
    for flags in "${variants[@]}"; do
      i=$((i + 1))
      dir=build/quant-variant-$i
      ( cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMKIT_CUDA=ON -DVRAMKIT_KERNELS=ON \
          -DVRAMKIT_TESTS=OFF -DVRAMKIT_BENCH=OFF -DVRAMKIT_PYTHON=OFF "-DCMAKE_CUDA_FLAGS=$flags" \
        && cmake --build "$dir" --target vramkit_kernels ) >"$out/quant-variant-$i.log" 2>&1 &
    done
    wait
    i=0
    for flags in "${variants[@]}"; do
      i=$((i + 1))
      echo "== variant $i: $flags"
      dir=build/quant-variant-$i
      if [ ! -f "$dir/libvramkit_kernels.so" ] || grep -q "FAILED\|Error" "$out/quant-variant-$i.log"; then
        tail -20 "$out/quant-variant-$i.log"; status=1; continue
      fi
      cp "$dir/libvramkit_kernels.so" "$lib"
      python3 -m pytest -m gpu python/tests/test_gpu_quant.py -q -p no:cacheprovider >"$out/quant-variant-$i-tests.log" 2>&1 \
        || status=1
      echo "tests: $(tail -1 "$out/quant-variant-$i-tests.log")"
      python3 benchmarks/quant_bench.py --no-model 2>&1 | tee "$out/quant-variant-$i.txt" | tail -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      cp "$out/kernels-installed.so.keep" "$lib"
    done
    rm -f "$out/kernels-installed.so.keep"
    trap - EXIT
  fi
fi
if [[ $bench == *,emul,* ]]; then
  echo "== PyTorch allocator emulation against the real allocator"
  python3 benchmarks/torch_emulation_check.py "${VRAMKIT_TRACE_DIR:?emul needs VRAMKIT_TRACE_DIR}" \
    --json "$out/emul-check.json" 2>&1 | tee "$out/emul-check.txt" | tail -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ $bench == *,checkpoint,* ]] && [ -f benchmarks/checkpoint_bench.py ]; then
  echo "== gradient-checkpoint plans against no checkpointing, sqrt(n) and everything"
  python3 benchmarks/checkpoint_bench.py --json "$out/checkpoint.json" 2>&1 | tee "$out/checkpoint.txt" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ $bench == *,e2e,* ]]; then
  echo "== end to end: seven workloads under PyTorch's default, expandable_segments and vramkit"
  python3 benchmarks/gpu_end_to_end.py --json "$out/e2e.json" 2>"$out/e2e-progress.log" | tee "$out/e2e.txt" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ $bench == *,access,* ]]; then
  echo "== the same kernels over cudaMalloc memory and over vramkit's mapped pages"
  python3 benchmarks/vmm_access_bench.py --json "$out/vmm-access.json" 2>&1 | tee "$out/vmm-access.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ -n "${VRAMKIT_TRACE_DIR:-}" ] && [ -n "${VRAMKIT_ANCHORS_DIR:-}" ]; then
  echo "== anchors and vramkit on the same .ops files, one run"
  # The harness reads plain *.trace.csv files; the traces may come gzipped (*.trace.csv.gz).
  traces=$VRAMKIT_TRACE_DIR
  if compgen -G "$VRAMKIT_TRACE_DIR/*.trace.csv.gz" >/dev/null; then
    traces=$out/traces
    mkdir -p "$traces"
    for f in "$VRAMKIT_TRACE_DIR"/*.trace.csv.gz; do
      n=$(basename "$f" .gz)
      [ -f "$VRAMKIT_TRACE_DIR/$n" ] && continue  # the plain file is linked below
      if gzip -dc "$f" > "$traces/$n.part"; then
        mv "$traces/$n.part" "$traces/$n"
      else
        rm -f "$traces/$n.part"; echo "cannot read $f"; status=1
      fi
    done
    for f in "$VRAMKIT_TRACE_DIR"/*.trace.csv; do
      [ -f "$f" ] && ln -sf "$(realpath "$f")" "$traces/$(basename "$f")"
    done
  fi
  echo "traces: $(ls "$traces" | grep -c '\.trace\.csv$') (*.trace.csv), and the harness's two synthetic ones"
  python3 "$VRAMKIT_ANCHORS_DIR/anchors.py" "$traces" "$out/anchors" > "$out/anchors.log" 2>&1 || status=1
  replay=build/gpu/cpp/bench/vramkit_replay_bench
  if [ ! -x "$replay" ]; then  # the tests were skipped (VRAMKIT_GPU_TESTS=0): the replay bench alone
    replay=build/gpu-bench/cpp/bench/vramkit_replay_bench
    { cmake -S . -B build/gpu-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMKIT_CUDA=ON -DVRAMKIT_KERNELS=OFF \
        -DVRAMKIT_TESTS=OFF -DVRAMKIT_PYTHON=OFF && cmake --build build/gpu-bench --target vramkit_replay_bench; } \
      >"$out/bench-build.log" 2>&1 || { tail -20 "$out/bench-build.log"; status=1; }
  fi
  "$replay" --passes 4 --allocator vramkit --allocator "pool:upstream=cuda" \
    --allocator "pool:keep_mappings:false" \
    "$out"/anchors/*.ops | sed 's/^/RESULT /' | tee -a "$out/anchors.log"
  python3 "$VRAMKIT_ANCHORS_DIR/table.py" "$out/anchors.log"
fi
exit $status
