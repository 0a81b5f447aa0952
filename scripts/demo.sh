#!/usr/bin/env bash
# The main job: replay the packaged real trace (BERT inference with dynamic
# shapes) through vramkit and the plain upstream, and write the HTML report.
# Give a trace file to use your own: scripts/demo.sh my_snapshot.pickle
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m vramkit info
python3 -m vramkit report "$@" -o vramkit-report.html
