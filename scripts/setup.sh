#!/usr/bin/env bash
# Installs what vramkit needs to build and test on a Debian machine, then the
# package itself (idempotent: skips what is already there).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v ninja >/dev/null || need+=(ninja-build)
command -v cmake >/dev/null || need+=(cmake)
command -v ccache >/dev/null || need+=(ccache)
if [ "${VRAMKIT_SETUP_TEST_TOOLS:-0}" = 1 ]; then
  command -v chromium >/dev/null || need+=(chromium)
  command -v prometheus >/dev/null || need+=(prometheus)
  command -v tmux >/dev/null || need+=(tmux)
  command -v clang++ >/dev/null || need+=(clang)
  [ -e /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
  [ -e /usr/include/benchmark/benchmark.h ] || need+=(libbenchmark-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The locale tests need a decimal-comma locale (de_DE.UTF-8); generate it when missing.
if [ "${VRAMKIT_SETUP_TEST_TOOLS:-0}" = 1 ] && ! locale -a 2>/dev/null | grep -qix 'de_DE.utf-\?8'; then
  if [ ! -e /etc/locale.gen ] || ! command -v locale-gen >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends locales >/dev/null || true
  fi
  if [ -e /etc/locale.gen ] && command -v locale-gen >/dev/null; then
    grep -q '^de_DE.UTF-8 UTF-8' /etc/locale.gen || sed -i 's/^# *de_DE.UTF-8 UTF-8/de_DE.UTF-8 UTF-8/' /etc/locale.gen
    grep -q '^de_DE.UTF-8 UTF-8' /etc/locale.gen || echo 'de_DE.UTF-8 UTF-8' >> /etc/locale.gen
    locale-gen >/dev/null || echo "setup: could not generate de_DE.UTF-8 (locale tests will skip)" >&2
  fi
fi
py=${PYTHON:-python3}
$py -m pip install -q --disable-pip-version-check "nanobind>=2" "scikit-build-core>=0.10" numpy pytest 2>&1 | grep -v "Running pip as the 'root' user" || true
# Reuses build/py-* between runs, so an unchanged tree rebuilds nothing.
$py -m pip install -q --disable-pip-version-check --no-build-isolation . 2>&1 | grep -v "Running pip as the 'root' user" || true
$py -c "import vramkit" || { echo "setup: vramkit did not install" >&2; exit 1; }
