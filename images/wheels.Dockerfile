# Node kind "wheels": a builder stage makes wheels in /wheels; stage "wheels" (FROM scratch) holds only them,
# so `docker build --target wheels --output type=local,dest=<wheelhouse tmp>` exports just the wheel files.
#
# Build args (contract: cudastack/model.py):
#   PARENT_IMAGE   the image to build in (the torch node: torch, CUDA_HOME, compilers, /opt/venv)
#   METHOD         "wheel":  pip download --no-deps --only-binary=:all: PIP_SPECS (a pinned wheel from the index)
#                  "source": pip wheel --no-deps --no-build-isolation, from PIP_SPECS (sdist, git+https://...@ref,
#                            or a path such as ./src, relative to the build context: pip runs in /ctx)
#                            or, when SOURCE_DIR is set, from that folder of the build context
#   PIP_SPECS      space separated requirements
#   SOURCE_DIR     optional: a folder in the build context holding a pip-installable source tree
#   BUILD_ENV      space separated K=V applied to the build (the component's knobs, e.g. "MAX_JOBS=1
#                  NVCC_THREADS=2 FLASH_ATTN_CUDA_ARCHS=120"); values with spaces are shell-quoted
#                  (K='12.0a 12.1a'), the string is evaluated by /bin/sh as `export $BUILD_ENV`
#   BUILD_DEPS     optional, METHOD=source: space separated requirements pip-installed into the builder's venv
#                  first, because --no-build-isolation needs the build backend present (e.g. "scikit-build-core
#                  cmake" for sgl-kernel); they stay in the builder stage, never in the exported wheels
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional (never with a login: that is the secret pipindex)
#   PIP_SPECS_LOCKED, BUILD_DEPS_LOCKED   optional (locked builds): hash-checking requirements text replacing
#                  PIP_SPECS (METHOD=wheel: pip download --require-hashes) / BUILD_DEPS (pip install
#                  --require-hashes --no-deps). A locked source build's sdist is checked against the lock's
#                  sha256 by the executor before it is unpacked into the context.
# Secrets (optional): id=cabundle (CA bundle; never in a layer), id=pipindex (a private index URL with its login,
# exported as PIP_INDEX_URL by with-build-ca; never a build arg, never in a layer). Cache mounts: pip's cache and ccache
# (CCACHE_DIR; gcc/g++ through /usr/lib/ccache, CMake launchers for C, C++ and CUDA).
# The build context is bind-mounted read-write at /ctx for the one RUN (changes are discarded, nothing is copied
# into a layer); a context with no source folder is fine for METHOD=wheel.
ARG PARENT_IMAGE
FROM ${PARENT_IMAGE} AS builder

ARG METHOD=wheel
ARG PIP_SPECS=""
ARG SOURCE_DIR=""
ARG BUILD_ENV=""
ARG BUILD_DEPS=""
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_SPECS_LOCKED=""
ARG BUILD_DEPS_LOCKED=""

RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.cache/ccache \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    --mount=type=bind,target=/ctx,rw \
    set -eu; \
    export CCACHE_DIR=/root/.cache/ccache CCACHE_MAXSIZE=20G \
           CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache; \
    if [ -d /usr/lib/ccache ]; then export PATH="/usr/lib/ccache:$PATH"; fi; \
    if [ -n "${BUILD_ENV}" ]; then eval "export ${BUILD_ENV}"; fi; \
    mkdir -p /wheels; \
    case "${METHOD}" in \
      wheel) \
        test -n "${PIP_SPECS}" || { echo "METHOD=wheel needs PIP_SPECS (pinned requirements)" >&2; exit 2; }; \
        if [ -n "${PIP_SPECS_LOCKED}" ]; then \
          echo "cudastack: PIP_SPECS in hash-checking mode (lockfile)"; \
          printf '%s\n' "${PIP_SPECS_LOCKED}" > /tmp/locked.txt; \
          with-build-ca pip download -q --no-deps --only-binary=:all: --require-hashes -d /wheels -r /tmp/locked.txt; \
        else \
          with-build-ca pip download -q --no-deps --only-binary=:all: -d /wheels ${PIP_SPECS}; \
        fi ;; \
      source) \
        if [ -n "${SOURCE_DIR}" ]; then \
          test -d "/ctx/${SOURCE_DIR}" || { echo "SOURCE_DIR=${SOURCE_DIR} is not a folder of the build context" >&2; exit 2; }; \
          set -- "/ctx/${SOURCE_DIR}"; \
        else \
          test -n "${PIP_SPECS}" || { echo "METHOD=source needs PIP_SPECS or SOURCE_DIR" >&2; exit 2; }; \
          set -- ${PIP_SPECS}; \
        fi; \
        cd /ctx; \
        if [ -n "${BUILD_DEPS_LOCKED}" ]; then \
          echo "cudastack: BUILD_DEPS in hash-checking mode (lockfile)"; \
          printf '%s\n' "${BUILD_DEPS_LOCKED}" > /tmp/build-deps-locked.txt; \
          with-build-ca pip install -q --require-hashes --no-deps -r /tmp/build-deps-locked.txt; \
        elif [ -n "${BUILD_DEPS}" ]; then with-build-ca pip install -q ${BUILD_DEPS}; fi; \
        with-build-ca nice -n 10 pip wheel -v --no-deps --no-build-isolation -w /wheels "$@" ;; \
      *) echo "METHOD must be 'wheel' or 'source', got '${METHOD}'" >&2; exit 2 ;; \
    esac; \
    ls -l /wheels; \
    ls /wheels/*.whl >/dev/null

FROM scratch AS wheels
COPY --from=builder /wheels/ /
