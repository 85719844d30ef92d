#!/usr/bin/env bash
# Here, before a stretch on the GPU machine: the parts that e2e-gpu.sh's calls carry, in .gpuparts/ (git-ignored,
# listed in .git/info/exclude).
#   .gpuparts/all/p0 ..   the vLLM/Ray wheel set and TRL's together, at most 60 MiB a part (9 parts; the last,
#                         about 11 MiB, travels with the last node part)
#   .gpuparts/node/p0 ..  the node's programs and packages (one xz stream: about 8 minutes on 2 cores)
# Usage: bash benchmarks/device/pack-parts.sh [WHEEL-LIST]   (default ../shared/gpu/gpu-wheels.txt)
set -euo pipefail
wheels=${1:-../shared/gpu/gpu-wheels.txt}
list=$(mktemp)
trap 'rm -f "$list"' EXIT
cat "$wheels" benchmarks/device/trl-wheels.txt >"$list"
rm -rf .gpuparts/all .gpuparts/node
bash ../shared/gpu/pack-wheels.sh "$list" .gpuparts/all
"${PYTHON:-.venv/bin/python}" -m grpojob_testing.gpu_node pack .gpuparts/node >/dev/null
du -sh .gpuparts/all/p* .gpuparts/node/p*
