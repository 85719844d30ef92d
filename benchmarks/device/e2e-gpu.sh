#!/usr/bin/env bash
# A GRPOJob on a real node with a real GPU, on the device machine (`make e2e-gpu` by hand).
# Each step is one device call; the machine is handed back 30 s after a call ends, so call them back to back.
#
#   caps                 first call: what the kernel allows (cgroups, netfilter, bridge, overlay, ...); starts
#                        describing the machine's Python layer (its digest: about 50 s) in the background, so that
#                        `node`'s import of the base layers only sends it
#   part DIR...          copy parts (carry them): the node's (.gpuparts/node/p*), the wheels' (.gpuparts/all/p*: the
#                        vLLM/Ray set and TRL's together; .gpuparts/p* and .gpuparts/trl, as for h200.sh, also do), all
#                        made here by `bash benchmarks/device/pack-parts.sh`
#   node                 with the node's parts: install them (programs, containerd/runc/CNI/iptables; the operator's
#                        wheels aside until the others come), start the cluster with the GPU node, and begin importing
#                        the machine's own layers (system, Python: 16 GB, minutes) into its containerd in the
#                        background, while the next calls carry the wheels
#   install              with the last wheel part: install the wheels (h200.sh install) and the operator's beside
#                        them, compile their bytecode
#   up                   wait for the base layers, import the layer of the wheels and our code, helm-install the chart
#   test [PYTEST ARGS]   tests/gpu/test_e2e_gpu.py against that cluster (e.g. `-k 1_5b`, then `-k 7b`), in the
#                        background: followed for 9 minutes, then `wait` follows it on
#   bench [ARGS]         benchmarks/cluster_vs_local.py: one job applied to that cluster, then the same job by
#                        `grpojob run` on the same GPU (step time, time to the first step; into $OUT), likewise
#   interval [ARGS]      benchmarks/checkpoint_interval.py by `grpojob run` on the GPU: a checkpoint every step against
#                        every ten (e.g. `--example examples/tiny-gpu.yaml --shape qwen2.5-1.5b --lora-rank 64 --steps 12
#                        --repeats 1`; with the wheels installed, no cluster needed), likewise
#   wait [NAME [SECS]]   follow a test (NAME e2e-gpu, the default), benchmark (bench, interval) or the base import
#                        (base); FOLLOW=0 before test, bench or interval starts it without following it
#   logs                 the cluster's logs and the jobs' pods into $OUT (a failed step saves them too)
#
# Which calls, in order (carry = the folders each names; a call carries at most 64 MiB, so one part, or
# the two small last ones together):
#   1. caps; part .gpuparts/node/p0       2. part .gpuparts/node/p1
#   3. part .gpuparts/node/p2 .gpuparts/all/p8 && node   (the base layers' import starts: about 4 minutes)
#   4.-10. part .gpuparts/all/p0 .. p6     11. part .gpuparts/all/p7 && install
#   12. up (waits for the base layers, then the image layer and the chart), then test -k 1_5b, bench, test -k 7b
# Node first lets the base layers' import run while the wheels come. To keep the GPU busy meanwhile instead
# (a benchmark that needs no cluster), carry the wheels first: part .gpuparts/all/p0 .. p8 && install &&
# FOLLOW=0 interval ..., then the node's parts, node && install (the operator's wheels), up.
# On an H100 machine each part's call took about 5 s, `install` 30-45 s, `node` 48 s (the node Ready in 14 s) and
# `up` 310 s when it came right after `node`.
set -uo pipefail
export PYTHONPATH=/tmp/site-packages:/root/operator-site-packages:$PWD/api:$PWD/operator:$PWD/trainer:$PWD/testing
export VLLM_WORKER_MULTIPROC_METHOD=spawn HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# No bytecode written into the machine's Python while its layers are being imported (`node` starts that in the
# background): a file that appears between the import's two passes makes it start over. compileall writes anyway.
export PYTHONDONTWRITEBYTECODE=1
export GRPOJOB_TEST_KUBECONFIG=$HOME/.cache/grpojob/clusters/gpu/kubeconfig
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
kubectl() { "$(ls -d "$HOME"/.cache/grpojob/bin/kubernetes-*/kubectl | head -1)" --kubeconfig "$GRPOJOB_TEST_KUBECONFIG" "$@"; }
save_logs() {
  # The cluster's programs' logs, and every container's on the node (kept after a pod ends, until it is deleted).
  tar czf "$OUT/cluster-logs.tgz" -C "$HOME/.cache/grpojob/clusters/gpu" logs node/pod-logs 2>/dev/null
  kubectl get grpojobs,rayclusters,pods -A -o wide >"$OUT/objects.txt" 2>&1
  kubectl describe pods -A >"$OUT/pods.txt" 2>&1
}
# A test or benchmark runs in its own process session, so a call that ends at its 10-minute limit leaves it
# running: `wait NAME` in the next call follows it on (its log comes back in $OUT either way).
background() {
  local name=$1
  shift
  rm -f "/root/$name.rc"
  setsid nohup bash -c '"$@" >"/root/'"$name"'.log" 2>&1; echo $? >"/root/'"$name"'.rc"' _ "$@" </dev/null >/dev/null 2>&1 &
}
follow() {
  local name=$1 limit=$2 waited=0
  while [ ! -f "/root/$name.rc" ] && [ "$waited" -lt "$limit" ]; do sleep 5; waited=$((waited + 5)); done
  cp "/root/$name.log" "$OUT/$name.log" 2>/dev/null
  tail -n 60 "/root/$name.log" 2>/dev/null
  if [ -f "/root/$name.rc" ]; then return "$(cat "/root/$name.rc")"; fi
  echo "$name: still running after ${limit}s; follow it with \`wait $name\`"
}
# A step that fails leaves the cluster's logs in $OUT: the machine may be gone before another call.
trap 'rc=$?; [ "$rc" -eq 0 ] || [ "$1" = caps ] || save_logs; exit "$rc"' EXIT
case $1 in
  caps)
    background describe python3 -m grpojob_testing.host_image describe-base
    python3 -m grpojob_testing.gpu_node capabilities 2>&1 | tee "$OUT/capabilities.txt" ;;
  part)
    # A node part goes beside the others of its kind; the wheels' parts where h200.sh expects them.
    shift
    for dir in "$@"; do
      case $dir in
        *node*) mkdir -p /root/node-parts && cp "$dir"/* /root/node-parts/ && ls /root/node-parts | wc -l ;;
        *) benchmarks/device/h200.sh part "$dir" ;;
      esac || exit 1
    done ;;
  node)
    set -e
    time python3 -m grpojob_testing.gpu_node unpack /root/node-parts --site-packages /root/operator-site-packages
    # CUDA once on the host, so that the driver has made /dev/nvidia-uvm before the device plugin hands it out.
    python3 -c 'import torch; torch.ones(1, device="cuda"); print(torch.cuda.get_device_name(0))'
    time python3 -m grpojob_testing.gpu_cluster node 2>&1 | tee -a "$OUT/up.log"
    python3 -m grpojob_testing.host_image plan | tee "$OUT/image-plan.txt"
    # The largest folders of the image's trees (what the base layers' import spends its minutes on).
    du -x --max-depth=4 /usr "$(python3 -c 'import sys; print(sys.prefix)')" 2>/dev/null | sort -n | tail -40 \
      >"$OUT/image-sizes.txt" || true
    # The import waits for the layers' descriptors if `caps` is still making them (without them it makes its own).
    background base bash -c 'while [ -f /root/describe.log ] && [ ! -f /root/describe.rc ]; do sleep 1; done
      exec python3 -m grpojob_testing.gpu_cluster base'
    kubectl get nodes -o wide
    kubectl get node grpojob-node -o jsonpath='{.status.allocatable}'; echo ;;
  install)
    set -e
    [ -d /tmp/site-packages/vllm ] || benchmarks/device/h200.sh install
    # The operator's wheels come with the node's parts (`node` unpacks them): install again after `node`.
    [ ! -d /root/operator-site-packages ] || python3 -m grpojob_testing.gpu_node merge /root/operator-site-packages
    # The pods' root filesystem is read-only: their Python finds its bytecode compiled, or compiles every start.
    time python3 -m compileall -q -j 0 /tmp/site-packages >/dev/null || true
    df -h / ;;
  up)
    set -e
    # Without the base layers (their import failed) the images carry every layer, as they would in one go.
    follow base 480 || echo "the base layers' import failed: the images' import sends every layer"
    [ -f /root/base.rc ] || { echo "the base layers are still being imported: call up again"; exit 1; }
    time python3 -m grpojob_testing.gpu_cluster images 2>&1 | tee -a "$OUT/up.log"
    kubectl get pods -A ;;
  test)
    shift
    background e2e-gpu python3 -m pytest -p no:cacheprovider -rA -s tests/gpu/test_e2e_gpu.py "$@"
    follow e2e-gpu "${FOLLOW:-540}" ;;
  bench)
    shift
    background bench python3 benchmarks/cluster_vs_local.py --out /root/cluster-vs-local.json "$@"
    follow bench "${FOLLOW:-540}"
    cp /root/cluster-vs-local.* "$OUT"/ 2>/dev/null || true ;;
  interval)
    shift
    background interval env TMPDIR=/var/tmp python3 benchmarks/checkpoint_interval.py --json /root/interval.json "$@"
    follow interval "${FOLLOW:-540}"
    cp /root/interval.json "$OUT"/ 2>/dev/null || true ;;
  wait)
    follow "${2:-e2e-gpu}" "${3:-540}"
    cp /root/interval.json /root/cluster-vs-local.* "$OUT"/ 2>/dev/null || true ;;
  logs) save_logs ;;
  *) echo "unknown step $1"; exit 2 ;;
esac
