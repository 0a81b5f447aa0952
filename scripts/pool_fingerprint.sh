#!/usr/bin/env bash
# Prints what the caching pool did on every trace and in every stream model
# run: its counters, peak reserved and fragmentation per trace and pool
# configuration (benchmarks/pool_counters.py), and per stream-model run its
# counters and a hash of every address it handed out. Run it before and after
# a change to the pool and diff the two outputs: a refactor leaves them equal.
#
#   scripts/pool_fingerprint.sh TRACE_DIR [ANCHORS_DIR] > before.txt
#
# Needs the vramkit Python package of the same source installed
# (pip install --no-build-isolation .); builds quick_replay and the C++ tests
# in build/default. VRAMKIT_STREAM_SEEDS=N runs more stream model seeds.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: scripts/pool_fingerprint.sh TRACE_DIR [ANCHORS_DIR]" >&2
  exit 2
fi
traces=$(cd "$1" && pwd)
anchors=${2:+$(cd "$2" && pwd)}
cd "$(dirname "$0")/.."
cmake --preset default -DVRAMKIT_KERNELS=OFF >/dev/null
cmake --build build/default -j "${JOBS:-2}" --target quick_replay vramkit_tests >/dev/null
python3 benchmarks/pool_counters.py "$traces" ${anchors:+"$anchors"} --passes 5 \
  --quick-replay "$PWD/build/default/cpp/bench/quick_replay"
echo
echo "stream model runs (test_pool_streams.cpp):"
VRAMKIT_STREAM_DIGEST=1 build/default/cpp/tests/vramkit_tests --gtest_filter='pool_streams.*' | grep '^digest'
