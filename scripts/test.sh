#!/usr/bin/env bash
# Every test: C++ (normal, ASan+UBSan, TSan), the libFuzzer target for a
# bounded time, and pytest. Fails on the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
export VRAMKIT_SETUP_TEST_TOOLS=1
bash scripts/setup.sh
export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache}
jobs=$(nproc)

echo "== C++ tests (RelWithDebInfo)"
cmake --preset default -DVRAMKIT_KERNELS=OFF >/dev/null
cmake --build build/default -j "$jobs"
ctest --test-dir build/default -j "$jobs" --output-on-failure

echo "== C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake --preset asan >/dev/null
cmake --build build/asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan -j "$jobs" --output-on-failure

echo "== C++ tests under ThreadSanitizer (8-thread stress included)"
cmake --preset tsan >/dev/null
cmake --build build/tsan -j "$jobs"
# TSan needs a fixed address-space layout; setarch turns randomization off.
TSAN_OPTIONS=halt_on_error=1 setarch "$(uname -m)" -R ctest --test-dir build/tsan -j "$jobs" --output-on-failure

echo "== libFuzzer over pool operation sequences (${VRAMKIT_FUZZ_SECONDS:-60} s)"
if command -v clang++ >/dev/null; then
  cmake --preset fuzz >/dev/null
  cmake --build build/fuzz -j "$jobs"
  mkdir -p build/fuzz/corpus
  ./build/fuzz/cpp/fuzz/vramkit_pool_fuzz -max_total_time="${VRAMKIT_FUZZ_SECONDS:-60}" -max_len=512 \
    -artifact_prefix=build/fuzz/ build/fuzz/corpus 2>&1 | tail -3
else
  echo "clang++ not found: fuzz target skipped"
fi

echo "== Python tests"
set +e
python3 -m pytest -q -ra python/tests
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit $rc
