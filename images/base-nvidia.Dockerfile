# Base node, kind "base-nvidia": NVIDIA's CUDA devel image (what clusters normally pull) + the same Python venv
# conventions as base-pip, so later nodes (image, wheels, runtime) do not care which base they sit on:
# /opt/venv first on PATH, CUDA_HOME=/usr/local/cuda, /usr/local/bin/with-build-ca, g++/git/ccache present,
# CPLUS_INCLUDE_PATH with CUDA 13's include/cccl (case C7; a missing folder is ignored by the compiler).
#
# Build args (contract: cudastack/model.py):
#   BASE_IMAGE     e.g. nvidia/cuda:13.1.1-cudnn-devel-ubuntu24.04 (Ubuntu/Debian based, CUDA at /usr/local/cuda)
#   CUDA_VERSION   "13.1.1": checked against `nvcc --version` (major.minor)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional (never with a login: that is the secret pipindex)
#   VENV_PIP_SPECS_LOCKED   optional (locked builds): hash-checking requirements text replacing VENV_PIP_SPECS;
#                  a locked build also passes BASE_IMAGE by digest (name@sha256:...)
# Secret (optional): id=cabundle, a CA bundle for an intercepting HTTPS proxy (pip, git, curl, and apt's https
# sources such as NVIDIA's CUDA repository); never written to a layer; id=pipindex, a private index URL with its
# login, which with-build-ca exports as PIP_INDEX_URL (never a build arg: build args persist in the image history).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG VENV_PIP_SPECS="pip==25.3 setuptools==80.9.0 wheel==0.45.1 ninja==1.13.0 packaging==25.0"

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1

RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    set -eu; \
    rm -f /etc/apt/apt.conf.d/docker-clean; \
    ca=""; if [ -s /run/secrets/cabundle ]; then ca="-o Acquire::https::CAInfo=/run/secrets/cabundle"; fi; \
    apt-get $ca update -qq; \
    apt-get $ca install -y -qq --no-install-recommends \
        python3 python3-venv python3-dev g++ make git ccache binutils ca-certificates >/dev/null; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'

RUN printf '%s\n' '#!/bin/sh' \
      '# Use the build-time CA bundle (BuildKit secret "cabundle") when it is mounted; it is never stored.' \
      'ca=/run/secrets/cabundle' \
      'if [ -s "$ca" ]; then' \
      '  export PIP_CERT="$ca" SSL_CERT_FILE="$ca" REQUESTS_CA_BUNDLE="$ca" CURL_CA_BUNDLE="$ca" GIT_SSL_CAINFO="$ca"' \
      'fi' \
      '# A private index with a login arrives as the BuildKit secret "pipindex" (the whole URL), never as a build arg.' \
      'if [ -s /run/secrets/pipindex ]; then PIP_INDEX_URL="$(cat /run/secrets/pipindex)"; export PIP_INDEX_URL; fi' \
      '[ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL' \
      '[ -n "${PIP_EXTRA_INDEX_URL:-}" ] || unset PIP_EXTRA_INDEX_URL' \
      'exec "$@"' > /usr/local/bin/with-build-ca \
 && chmod 755 /usr/local/bin/with-build-ca

RUN python3 -m venv /opt/venv
# declared here, not at the top, so the layers above do not depend on it
ARG CUDA_VERSION
ARG VENV_PIP_SPECS_LOCKED=""
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CUDA_HOME=/usr/local/cuda \
    CUDA_VERSION=${CUDA_VERSION} \
    CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    set -eu; \
    test -n "${CUDA_VERSION}" || { echo "build arg CUDA_VERSION is empty (expected e.g. 13.1.1)" >&2; exit 2; }; \
    if [ -n "${VENV_PIP_SPECS_LOCKED}" ]; then \
        echo "cudastack: VENV_PIP_SPECS in hash-checking mode (lockfile)"; \
        printf '%s\n' "${VENV_PIP_SPECS_LOCKED}" > /tmp/venv-locked.txt; \
        with-build-ca pip install -q --require-hashes --no-deps -r /tmp/venv-locked.txt; \
        rm -f /tmp/venv-locked.txt; \
    else \
        with-build-ca pip install -q ${VENV_PIP_SPECS}; \
    fi; \
    want="release ${CUDA_VERSION%.*},"; \
    nvcc --version | grep -q "$want" || { echo "BASE_IMAGE's nvcc is not CUDA ${CUDA_VERSION}: $(nvcc --version | tail -2)" >&2; exit 2; }

LABEL org.cudastack.kind="base-nvidia" \
      org.cudastack.cuda.version="${CUDA_VERSION}"

WORKDIR /root
CMD ["/bin/bash"]
