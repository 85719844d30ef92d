# The two commands a newcomer runs on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint docs generate cluster-binaries cluster-up cluster-down image-tools images gpu-image node-packages e2e e2e-gpu kind-node-image e2e-kind

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3

# uv installs the same pinned versions as pip, from a cache that keeps the unpacked wheels and hard-links
# them into the environment: a minute instead of three for a second clone, and no second copy on disk.
# --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (CI's machine), every process
# would otherwise compile torch and transformers again, and `make test` took 2000 s instead of 1400.
export UV_CACHE_DIR ?= $(HOME)/.cache/grpojob/uv
UV_PIP := $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python

$(BIN)/uv: | $(BIN)/python
	$(BIN)/pip install --quiet uv==0.13.9

# Installs (or refreshes) the package with what the tests need, and the test tooling (testing/).
$(VENV)/.dev-installed: pyproject.toml testing/pyproject.toml | $(BIN)/uv
	$(UV_PIP) -e '.[dev]' -e ./testing
	touch $@

$(VENV)/.trainer-installed: pyproject.toml | $(BIN)/uv
	$(UV_PIP) -e '.[trainer]'
	touch $@

# The main job: a tiny random-init model learns the example arithmetic task with GRPO on this machine.
demo: $(VENV)/.trainer-installed
	rm -rf runs/tiny runs/tiny-checkpoints
	$(BIN)/grpojob tiny-model runs/tiny-model
	$(BIN)/grpojob dataset arithmetic --rows 256 --out runs/tiny-data/train.jsonl
	$(BIN)/grpojob run examples/tiny.yaml

# Style, and the layering contracts of pyproject's [tool.importlinter] (which packages may import which).
lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo

# The documentation site (mkdocs.yml, docs/) into build/site; --strict: a broken link or a page missing from the nav fails.
docs: $(VENV)/.dev-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Writes what is generated from the API's types: the CRD and the API reference page (tests fail when they drift).
generate: $(VENV)/.dev-installed
	$(BIN)/python -m grpojob_api.crd > charts/grpojob/crds/grpo.dev_grpojobs.yaml
	$(BIN)/python -m grpojob_api.reference > docs/reference/api.md

# Builds the pinned control-plane programs into ~/.cache/grpojob unless they are cached.
cluster-binaries: $(VENV)/.dev-installed
	$(BIN)/python -m grpojob_testing.build

# buildah, podman, debootstrap and runc from Debian at the versions of testing/image-packages.txt (root).
image-tools:
	testing/install-debian-packages testing/image-packages.txt

# Builds the base (Debian trixie, Python 3.13), the operator, CPU trainer, environments and nemo-gym images
# into ~/.cache/grpojob/images unless cached (each by the hash of its inputs).
images: image-tools $(VENV)/.dev-installed
	$(BIN)/python -m grpojob_testing.images build

# The GPU trainer image (vLLM, torch for CUDA 13.0; ~9 GB) into podman's storage unless cached: no
# test node runs it, its smoke test does (tests/integration/test_images.py).
gpu-image: image-tools $(VENV)/.dev-installed
	$(BIN)/python -m grpojob_testing.disk room-for-gpu-image
	$(BIN)/python -m grpojob_testing.images build-gpu

test: lint docs cluster-binaries
	$(BIN)/pytest

# containerd, runc, the CNI plugins and iptables from Debian at the versions of testing/node-packages.txt (root).
node-packages:
	testing/install-debian-packages testing/node-packages.txt

# The end-to-end suite on a real node (root): a cluster with kubelet, containerd, kube-proxy and CoreDNS,
# our images loaded into it, the chart helm-installed, GRPOJobs trained by real pods.
e2e: cluster-binaries node-packages images
	$(BIN)/pytest --real-node -rA tests/e2e

# GRPOJobs on a real node with the machine's GPUs (root, an NVIDIA GPU, and a Python with CUDA torch, vLLM and
# Ray: GPU_PYTHON): our device plugin advertises nvidia.com/gpu, the Ray pods' image is made of that Python's
# machine (`grpojob_testing.host_image`), the chart is helm-installed; skips, saying why, without a GPU.
# On the device machine, benchmarks/device/e2e-gpu.sh runs the same in calls of its own.
GPU_PYTHON ?= python3
e2e-gpu: cluster-binaries node-packages
	PYTHONPATH=$(CURDIR)/api:$(CURDIR)/operator:$(CURDIR)/trainer:$(CURDIR)/testing \
	  $(GPU_PYTHON) -m pytest -p no:cacheprovider -rA tests/gpu/test_e2e_gpu.py

# The kind node image of Kubernetes v1.34.4 from our programs and pinned Debian packages, into
# ~/.cache/grpojob/images unless cached, and into podman's storage (root).
kind-node-image: cluster-binaries image-tools
	$(BIN)/python -m grpojob_testing.kind build-node-image

# The same suite on a kind cluster with podman (root): our node image, our images and KubeRay loaded
# with `kind load image-archive`, kind's cluster deleted at the end (testing/kind/e2e).
e2e-kind: kind-node-image images
	testing/kind/e2e

cluster-up: cluster-binaries
	$(BIN)/python -m grpojob_testing.cluster up

cluster-down: $(VENV)/.dev-installed
	$(BIN)/python -m grpojob_testing.cluster down
