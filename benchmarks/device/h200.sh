#!/usr/bin/env bash
# The GPU session's steps on the device machine (an H200 with torch 2.11 and transformers, no vLLM/Ray):
#   part DIR     copy one part of the wheels (../shared/gpu/pack-wheels.sh output, one ≤ 60 MiB folder per call;
#                .gpuparts/trl and .gpuparts/verl hold loose wheels: trl-wheels.txt, verl-wheels.txt say how)
#   install      unpack every part and install the wheels into /tmp/site-packages
#   tests        the GPU tests (tests/gpu)
#   prepare      write the benchmark's model and rows (before legs run side by side)
#   bench LEG [TIMEOUT [ARGS...]]
#                one leg of benchmarks/gpu_grpo.py (results under /root/bench, copied to $OUT; ARGS go to the
#                script, e.g. --steps 6); the leg uses the GPUs of CUDA_VISIBLE_DEVICES, so two legs can run at
#                once on two GPUs
set -uo pipefail
# The wheels go to a folder named site-packages: dill (datasets' fingerprinting) pickles any module whose file is
# neither under the interpreter's prefix nor in a 'site-packages' path by value, and pickling pyarrow by value
# fails (`PicklingError: Can't pickle <class 'MonthDayNano'>`: what stopped the grpo-trl leg in session 5).
export PYTHONPATH=/tmp/site-packages:$PWD/api:$PWD/operator:$PWD/trainer:$PWD/testing
export VLLM_WORKER_MULTIPROC_METHOD=spawn HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
case $1 in
  part) mkdir -p /root/parts && cp "$2"/* /root/parts/ && ls /root/parts | wc -l ;;
  install)
    # Loose wheels beside the parts (a part of their own, carried as is) are optional.
    mkdir -p /root/whl && (cd /root/parts && cat part_* | tar xf - -C /root/whl) \
      && { cp /root/parts/*.whl /root/whl/ 2>/dev/null || true; } \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-packages /root/whl/*.whl \
      && python3 -c "import vllm, ray, trl; print('vllm', vllm.__version__, 'ray', ray.__version__, 'trl', trl.__version__)" \
      && python3 -c "import datasets; datasets.Dataset.from_list([{'a': 1}]); print('datasets', datasets.__version__)" \
      && if ls /root/whl/verl-*.whl >/dev/null 2>&1; then
        # verl's and TransferQueue's wheels also install top-level tests/ and scripts/ packages (and recipe/,
        # tutorial/), which would shadow the repository's tests package: neither imports them
        for d in tests scripts recipe tutorial; do
          grep -qs "^$d/" /tmp/site-packages/verl-*.dist-info/RECORD /tmp/site-packages/transferqueue-*.dist-info/RECORD \
            && rm -rf "/tmp/site-packages/$d"
        done
        python3 -c "import verl, hydra, tensordict, transfer_queue; print('verl', verl.__version__)"
      fi ;;
  prepare) python3 benchmarks/gpu_grpo.py prepare --out /root/bench ;;
  tests) python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu-tests.log" ;;
  bench)
    # A session of its own, so that what the leg started (vLLM engine, Ray) goes with it, and only that.
    setsid timeout "${3:-280}" python3 benchmarks/gpu_grpo.py "$2" --out /root/bench "${@:4}" > "$OUT/$2.log" 2>&1 &
    leg=$!
    wait "$leg"
    echo "$2: exit $?"; grep -E '^(Traceback|[A-Za-z]*Error)' "$OUT/$2.log" | head -5
    kill -9 -- "-$leg" 2>/dev/null; sleep 1
    cp /root/bench/*.json "$OUT/" 2>/dev/null ;;
  *) echo "unknown step $1"; exit 2 ;;
esac
