# Our three images, as targets of one Dockerfile that builds this repository's wheel once:
#
#   docker build --target operator     -t ghcr.io/grpojob/operator:0.1.0 .
#   docker build --target environments -t ghcr.io/grpojob/environments:0.1.0 .
#   docker build --target trainer      -t ghcr.io/grpojob/trainer:0.1.0 .            # GPU: vLLM
#   docker build --target trainer      -t ghcr.io/grpojob/trainer:0.1.0-cpu --build-arg WITH_VLLM=false .
#
# (The NeMo Gym image has a Dockerfile of its own, images/nemo-gym/Dockerfile: none of this is in it.)
#
# Every image of a job's Ray cluster runs Python 3.13: Ray refuses nodes and drivers of another
# Python minor version, and the NeMo Gym servers that join the cluster need Python >= 3.12.
# python:3.13-slim-trixie is also what `python -m grpojob_testing.images` makes without a registry
# (Debian's python3 in a debootstrapped trixie, tagged with this name). The versions of the Python
# packages are those pinned in pyproject.toml (dependencies and the extras `operator`,
# `environment`, `trainer`); the test tooling (testing/) is in no image.
#
# Every image runs as a non-root numeric user and works with a read-only root filesystem (the
# operator's pods mount an emptyDir at /tmp, where every cache goes).

ARG PYTHON_IMAGE=python:3.13-slim-trixie

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir build==1.6.1
# pyproject.toml names README.md as the long description: a one-line stand-in keeps documentation
# edits from rebuilding every image (the images' inputs are the files copied here).
COPY pyproject.toml ./
RUN echo "grpojob: GRPO post-training on Kubernetes (the repository's README.md)." > README.md
COPY api ./api
COPY operator ./operator
COPY trainer ./trainer
RUN python -m build --wheel --outdir /dist .

# The trainer's dependencies as pinned in pyproject.toml, apart from the wheel: a change to the
# sources rebuilds only the wheel's small layer.
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml images/extra_requirements.py images/vllm-requirements.txt /src/
RUN mkdir /requirements \
    && python /src/extra_requirements.py /src/pyproject.toml trainer > /requirements/trainer.txt \
    && cp /src/vllm-requirements.txt /requirements/trainer-with-vllm.txt

FROM ${PYTHON_IMAGE} AS operator-install
COPY --from=wheel /dist /dist
RUN python -m venv /opt/grpojob \
    && /opt/grpojob/bin/pip install --no-cache-dir "$(ls /dist/grpojob-*.whl)[operator]" \
    && /opt/grpojob/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE} AS environments-install
COPY --from=wheel /dist /dist
RUN python -m venv /opt/grpojob \
    && /opt/grpojob/bin/pip install --no-cache-dir "$(ls /dist/grpojob-*.whl)[environment]" \
    && /opt/grpojob/bin/pip uninstall --yes pip

# The GRPOJob operator (Kopf): kopf, kubernetes, prometheus-client; no torch, no Ray.
FROM ${PYTHON_IMAGE} AS operator
LABEL org.opencontainers.image.title="grpojob-operator" \
      org.opencontainers.image.description="The GRPOJob operator (Kopf): GRPO post-training of LLMs on Kubernetes" \
      org.opencontainers.image.source="https://github.com/grpojob/grpojob" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=operator-install /opt/grpojob /opt/grpojob
ENV PATH=/opt/grpojob/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GRPOJOB_METRICS_PORT=8080 \
    GRPOJOB_PROBE_PORT=8081
# Metrics (/metrics) and Kopf's liveness endpoint (/healthz).
EXPOSE 8080 8081
# A numeric UID/GID that exists nowhere else, so `runAsNonRoot` can verify it without /etc/passwd.
USER 65532:65532
ENTRYPOINT ["grpojob-operator"]

# Our own environment servers (NeMo Gym's protocol): the `environment` extra, no torch, no Ray.
#   docker run -e PORT=8080 -e POLICY_BASE_URL=http://policy:8000/v1 -p 8080:8080 \
#     ghcr.io/grpojob/environments:0.1.0 arithmetic
FROM ${PYTHON_IMAGE} AS environments
LABEL org.opencontainers.image.title="grpojob-environments" \
      org.opencontainers.image.description="GRPOJob environment servers (NeMo Gym protocol)" \
      org.opencontainers.image.source="https://github.com/grpojob/grpojob" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=environments-install /opt/grpojob /opt/grpojob
ENV PATH=/opt/grpojob/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    PORT=8080
EXPOSE 8080
USER 1000:1000
# `python -m grpojob_trainer.environments NAME`; it listens on $PORT. The operator passes each
# environment's command or args from the GRPOJob.
ENTRYPOINT ["python", "-m", "grpojob_trainer.environments"]
CMD ["arithmetic"]

# The Ray head and workers of every GRPOJob's RayCluster (vLLM generation engines and policy
# training) and the trainer Job (`grpojob train`) run this one image.
#
# Both variants start from the plain Python image (Debian trixie's Python 3.13, the Python of every
# image of a job's Ray cluster), install into a virtual environment /opt/grpojob owned by UID 1000
# and add that user (`ray`, group 100, as in the Ray images), so the libraries that look the user up
# (getpass) find it.
#
# CPU (WITH_VLLM=false; generation uses the transformers backend): the `trainer` extra as pinned in
# pyproject.toml. This is the variant the tests run (`python -m grpojob_testing.images build`). Less
# triton, which torch's Linux wheel requires for compiling GPU kernels: nothing compiles on a CPU
# (spec.training.torchCompile is GPU only), and it is 1 GB of every node's image load.
#
# GPU (default): vLLM, which pins its own torch and transformers, older than the `trainer` extra's.
# images/vllm-requirements.txt locks every package of that environment at the versions measured on
# the H200 (docs/benchmarks.md: vLLM 0.26.0, torch 2.11.0 built for CUDA 13.0, transformers 5.17.0,
# Ray 2.60.0) and the rest of the `trainer` extra; it is installed as it is, then this package
# without dependencies. Triton and vLLM compile small C helpers when they start, with the system's
# compiler and Python's headers: gcc and python3-dev (trixie's versions). The build fails if the
# installed Ray differs from the cluster's (rayVersion, grpojob_operator.settings.RAY_VERSION).
FROM ${PYTHON_IMAGE} AS trainer
ARG RAY_VERSION=2.60.0
ARG WITH_VLLM=true
LABEL org.opencontainers.image.title="grpojob-trainer" \
      org.opencontainers.image.description="GRPOJob trainer, vLLM generation and Ray workers" \
      org.opencontainers.image.source="https://github.com/grpojob/grpojob" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN (getent passwd 1000 >/dev/null || useradd --uid 1000 --gid 100 --home-dir /tmp/home --no-create-home ray) \
    && python -m venv /opt/grpojob \
    && chown -R 1000:100 /opt/grpojob
# KubeRay's default liveness and readiness probes of Ray pods run `wget`, which the plain Python base
# lacks (found by the e2e suite: Ray heads never became ready).
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget=1.25.0-2 \
    && if [ "${WITH_VLLM}" = "true" ]; then \
      apt-get install -y --no-install-recommends gcc=4:14.2.0-1 python3-dev=3.13.5-1; \
    fi \
    && rm -rf /var/lib/apt/lists/*
USER 1000
ENV PATH=/opt/grpojob/bin:$PATH
COPY --from=requirements --chown=1000:100 /requirements /tmp/requirements
RUN if [ "${WITH_VLLM}" = "true" ]; then \
      pip install --no-cache-dir --no-deps --requirement /tmp/requirements/trainer-with-vllm.txt; \
    else \
      pip install --no-cache-dir --requirement /tmp/requirements/trainer.txt \
      && pip uninstall --yes --quiet triton; \
    fi \
    && rm -rf /tmp/requirements
COPY --from=wheel --chown=1000:100 /dist /tmp/dist
RUN pip install --no-cache-dir --no-deps /tmp/dist/grpojob-*.whl \
    && rm -rf /tmp/dist \
    && python -c "import ray, sys; sys.exit(ray.__version__ != '${RAY_VERSION}')"
# Pods run with a read-only root filesystem and an emptyDir at /tmp: every cache goes there.
ENV PYTHONUNBUFFERED=1 \
    HOME=/tmp/home \
    XDG_CACHE_HOME=/tmp/cache \
    HF_HOME=/tmp/cache/huggingface \
    TRITON_CACHE_DIR=/tmp/cache/triton \
    VLLM_CACHE_ROOT=/tmp/cache/vllm \
    MPLCONFIGDIR=/tmp/cache/matplotlib
WORKDIR /tmp
# KubeRay sets the command of Ray pods (`ray start ...`); the operator sets the trainer's
# (`grpojob train --config ...`). By hand: `docker run IMAGE grpojob --help`.
CMD ["grpojob", "--help"]
