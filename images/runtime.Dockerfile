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
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional
# Build context: wheelhouse/ (may be empty) and stackprobe/ (the suite's package folder).
# Secret (optional): id=cabundle (CA bundle; never in a layer). Cache mount: pip's cache.
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

RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    set -eu; \
    if [ -n "${BUILD_ENV}" ]; then eval "export ${BUILD_ENV}"; fi; \
    set --; \
    for w in ${WHEEL_NAMES}; do \
      test -f "/wheelhouse/$w" || { echo "wheel $w is not in the wheelhouse; it holds: $(ls /wheelhouse)" >&2; exit 2; }; \
      set -- "$@" "/wheelhouse/$w"; \
    done; \
    if [ $# -gt 0 ] || [ -n "${PIP_SPECS}" ]; then with-build-ca pip install "$@" ${PIP_SPECS}; fi

# The validation suite: its package folder on the venv's path, plus what its static probes need.
COPY stackprobe /opt/stackprobe/stackprobe
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    set -eu; \
    with-build-ca pip install -q "pyelftools>=0.31"; \
    purelib="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    echo /opt/stackprobe > "$purelib/stackprobe.pth"; \
    cd / && python -c 'import stackprobe, elftools'
LABEL org.cudastack.kind="runtime"
