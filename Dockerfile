# The GRPOJob operator image: `docker build -t ghcr.io/grpojob/operator:0.1.0 .`
#
# Stage 1 builds the wheel of this repository; stage 2 installs it with the `operator` extra only
# (kopf, kubernetes, prometheus-client: no torch, no Ray) into a virtual environment; the final
# stage copies that environment onto a clean Python image and runs as a non-root numeric user, so
# it works with `runAsNonRoot` and a read-only root filesystem (nothing is written at run time; the
# chart still mounts an emptyDir at /tmp).

# Python 3.11 on Debian bookworm: also what `python -m grpojob_testing.images` can make without a
# registry (Debian's python3 in a debootstrapped bookworm, tagged with this name).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir build==1.6.1
COPY pyproject.toml README.md ./
COPY api ./api
COPY operator ./operator
COPY trainer ./trainer
COPY testing ./testing
RUN python -m build --wheel --outdir /dist .

FROM ${PYTHON_IMAGE} AS install
COPY --from=wheel /dist /dist
RUN python -m venv /opt/grpojob \
    && /opt/grpojob/bin/pip install --no-cache-dir "$(ls /dist/grpojob-*.whl)[operator]" \
    && /opt/grpojob/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="grpojob-operator" \
      org.opencontainers.image.description="The GRPOJob operator (Kopf): GRPO post-training of LLMs on Kubernetes" \
      org.opencontainers.image.source="https://github.com/grpojob/grpojob" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=install /opt/grpojob /opt/grpojob
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
