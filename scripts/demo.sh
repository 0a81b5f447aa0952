#!/usr/bin/env bash
# The main job: would this run fit, and with which allocator? Replays the
# packaged real trace (BERT inference with dynamic shapes) through PyTorch's
# allocator (emulated: default, expandable_segments and other settings) and
# vramkit, prints the answer, and writes the HTML report.
# Give a trace file to use your own: scripts/demo.sh my_snapshot.pickle
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m vramkit info
python3 -m vramkit advise "$@"
python3 -m vramkit report "$@" -o vramkit-report.html
