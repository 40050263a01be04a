# Node kind "runtime": the torch image + the wheelhouse's wheels + PIP_SPECS (sglang and friends) + the
# stackprobe validation suite (`python -m stackprobe` works in the image).
#
# Build args (contract: cudastack/model.py):
#   PARENT_IMAGE   the torch node's image
#   WHEEL_NAMES    space separated file names in the context's wheelhouse/ to install
#   PIP_SPECS      space separated pinned requirements installed together with the wheels
#   BUILD_ENV      space separated K=V applied to the pip command (shell-quoted values)
#   FLASHINFER_CUDA_ARCH_LIST, TORCH_CUDA_ARCH_LIST   optional; when given they become ENV of the image (JIT
#                  builds at run time use them); when empty they stay unset: FlashInfer's CompilationContext
#                  splits any value that is set, so an empty one would break it.
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional (never with a login: that is the secret pipindex)
#   PIP_SPECS_LOCKED, SUITE_PIP_SPECS_LOCKED   optional (locked builds): hash-checking requirements text
#                  replacing PIP_SPECS / SUITE_PIP_SPECS (pip --require-hashes --no-deps); PIP_SPECS_LOCKED is the
#                  whole closure, wheelhouse wheels included by name==version (found via --find-links)
#   WHEELS_LOCKED  optional (locked builds): `/wheelhouse/<file> --hash=sha256:...` lines for the wheelhouse
#                  wheels the closure does not name (wheels built from source), with the digests recorded when
#                  they were exported
#   SUITE_PIP_SPECS  what the validation suite's static probes need (pinned; locked like the others)
# Build context: wheelhouse/ (may be empty) and stackprobe/ (the suite's package folder: a convenience copy for
# hosts without the checkout; it is not part of the node's hash, so reports name the suite by its own digest and
# `invoke validate` mounts the checkout's suite by default).
# Secrets (optional): id=cabundle (CA bundle; never in a layer), id=pipindex (a private index URL with its login,
# exported as PIP_INDEX_URL by with-build-ca; never a build arg, never in a layer). Cache mount: pip's cache.
ARG PARENT_IMAGE
ARG FLASHINFER_CUDA_ARCH_LIST=""
ARG TORCH_CUDA_ARCH_LIST=""

FROM ${PARENT_IMAGE} AS rt-flashinfer
FROM rt-flashinfer AS rt-flashinfer-set
ARG FLASHINFER_CUDA_ARCH_LIST
ENV FLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST}"

FROM rt-flashinfer${FLASHINFER_CUDA_ARCH_LIST:+-set} AS rt-torch
FROM rt-torch AS rt-torch-set
ARG TORCH_CUDA_ARCH_LIST
ENV TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}"

FROM rt-torch${TORCH_CUDA_ARCH_LIST:+-set} AS runtime
ARG WHEEL_NAMES=""
ARG PIP_SPECS=""
ARG BUILD_ENV=""
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_SPECS_LOCKED=""
ARG WHEELS_LOCKED=""

RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    set -eu; \
    if [ -n "${BUILD_ENV}" ]; then eval "export ${BUILD_ENV}"; fi; \
    set --; \
    for w in ${WHEEL_NAMES}; do \
      test -f "/wheelhouse/$w" || { echo "wheel $w is not in the wheelhouse; it holds: $(ls /wheelhouse)" >&2; exit 2; }; \
      set -- "$@" "/wheelhouse/$w"; \
    done; \
    if [ -n "${PIP_SPECS_LOCKED}${WHEELS_LOCKED}" ]; then \
      echo "cudastack: PIP_SPECS and the wheelhouse in hash-checking mode (lockfile)"; \
      printf '%s\n' "${PIP_SPECS_LOCKED}" "${WHEELS_LOCKED}" > /tmp/locked.txt; \
      with-build-ca pip install --require-hashes --no-deps --find-links /wheelhouse -r /tmp/locked.txt; \
      rm -f /tmp/locked.txt; \
    elif [ $# -gt 0 ] || [ -n "${PIP_SPECS}" ]; then \
      : "one CUDA release for the toolkit wheels (C25): the release of the nvidia-cuda-runtime torch brought"; \
      rel="$(python -c 'from importlib.metadata import version as v; print(".".join(v("nvidia-cuda-runtime").split(".")[:2]))' 2>/dev/null || true)"; \
      : > /tmp/cuda-constraints.txt; \
      if [ -n "$rel" ]; then \
        for w in nvidia-cuda-nvcc nvidia-cuda-crt nvidia-cuda-cccl nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-nvrtc nvidia-cuda-cupti; do \
          echo "$w==$rel.*" >> /tmp/cuda-constraints.txt; \
        done; \
        echo "cudastack: CUDA toolkit wheels constrained to CUDA $rel (the release of nvidia-cuda-runtime)"; \
      fi; \
      with-build-ca pip install -c /tmp/cuda-constraints.txt "$@" ${PIP_SPECS}; \
      rm -f /tmp/cuda-constraints.txt; \
    fi

# The validation suite: its package folder on the venv's path, plus what its static probes need.
COPY stackprobe /opt/stackprobe/stackprobe
ARG SUITE_PIP_SPECS="pyelftools==0.33"
ARG SUITE_PIP_SPECS_LOCKED=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    set -eu; \
    if [ -n "${SUITE_PIP_SPECS_LOCKED}" ]; then \
      printf '%s\n' "${SUITE_PIP_SPECS_LOCKED}" > /tmp/suite-locked.txt; \
      with-build-ca pip install -q --require-hashes --no-deps -r /tmp/suite-locked.txt; \
      rm -f /tmp/suite-locked.txt; \
    else \
      with-build-ca pip install -q ${SUITE_PIP_SPECS}; \
    fi; \
    purelib="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    echo /opt/stackprobe > "$purelib/stackprobe.pth"; \
    cd / && python -c 'import stackprobe, elftools'
LABEL org.cudastack.kind="runtime"
