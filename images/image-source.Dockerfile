# Node kind "image", method "source": builds the component (torch) from the source folder of the build context
# into a wheel, installs that wheel into /opt/venv of the parent image and keeps it in /wheels.
#
# Build args (contract: cudastack/model.py):
#   PARENT_IMAGE   the image to extend (the base node: CUDA toolkit, compilers, ccache, /opt/venv)
#   SOURCE_DIR     the folder of the build context holding the source tree (the executor fetched, checked and
#                  patched it: cudastack/sources.py)
#   BUILD_ENV      space separated K=V for the build (values shell-quoted; evaluated by /bin/sh as
#                  `export $BUILD_ENV`): the recipe's USE_* knobs, TORCH_CUDA_ARCH_LIST, MAX_JOBS, CMAKE_ARGS
#   BUILD_DEPS     space separated pinned requirements installed first (--no-build-isolation needs them)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional (no login: secret pipindex)
# Secrets (optional): id=cabundle, id=pipindex (as image.Dockerfile). Cache mounts: pip's cache and ccache
# (CCACHE_DIR; gcc/g++ through /usr/lib/ccache, CMake launchers for C, C++ and CUDA). The build context is
# bind-mounted read-write at /ctx for the one RUN (changes are discarded).
ARG PARENT_IMAGE
FROM ${PARENT_IMAGE}

ARG SOURCE_DIR=src
ARG BUILD_ENV=""
ARG BUILD_DEPS=""
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL

RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.cache/ccache \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    --mount=type=bind,target=/ctx,rw \
    set -eu; \
    test -d "/ctx/${SOURCE_DIR}" || { echo "SOURCE_DIR=${SOURCE_DIR} is not a folder of the build context" >&2; exit 2; }; \
    export CCACHE_DIR=/root/.cache/ccache CCACHE_MAXSIZE=40G \
           CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache; \
    if [ -d /usr/lib/ccache ]; then export PATH="/usr/lib/ccache:$PATH"; fi; \
    if [ -n "${BUILD_ENV}" ]; then eval "export ${BUILD_ENV}"; fi; \
    if [ -n "${BUILD_DEPS}" ]; then with-build-ca pip install -q ${BUILD_DEPS}; fi; \
    mkdir -p /wheels; \
    cd "/ctx/${SOURCE_DIR}"; \
    with-build-ca nice -n 10 pip wheel -v --no-deps --no-build-isolation -w /wheels .; \
    ccache -s || true; \
    with-build-ca pip install /wheels/*.whl; \
    ls -l /wheels
