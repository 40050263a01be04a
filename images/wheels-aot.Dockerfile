# Node kind "wheels", method "aot" (FlashInfer ahead of time): the pinned wheels as they are, plus a
# `flashinfer-jit-cache` wheel of FlashInfer JIT modules compiled here for the target, so the runtime image
# loads them without nvcc. Stage "wheels" (FROM scratch) holds only the wheels (exported to the wheelhouse).
#
# Build args (contract: cudastack/model.py):
#   PARENT_IMAGE   the torch node (torch, CUDA_HOME with nvcc, compilers, /opt/venv)
#   PIP_SPECS      space separated pinned wheels (flashinfer-python==X, optionally flashinfer-cubin==X),
#                  downloaded with --no-deps into /wheels
#   BUILD_DEPS     space separated requirements installed (with their dependencies) into the builder's venv
#                  so FlashInfer's JIT can run: the same pins as PIP_SPECS
#   BUILD_ENV      K=V applied to the build: FLASHINFER_CUDA_ARCH_LIST (from the target), MAX_JOBS (the
#                  memory rule), shell-quoted, evaluated as `export $BUILD_ENV`
#   AOT_MODULES    space separated package.module:gen_<name>_module (FlashInfer's own generators)
#   AOT_PATCHES    JSON list of {file, replace, with, why}: literal edits to files of the installed
#                  flashinfer package (e.g. data/csrc/...) applied before the modules are generated
#   AOT_LOCAL_VERSION  local version segment of the jit-cache wheel ("cu131": 0.7.2+cu131)
#   PIP_SPECS_LOCKED, BUILD_DEPS_LOCKED   locked builds: hash-checking requirements text (pip download
#                  --require-hashes / pip install --require-hashes --no-deps)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional (never with a login: that is the secret pipindex)
# The build context holds aot/build_jit_cache.py (images/flashinfer-aot/), bind-mounted at /ctx.
# Cache mounts: pip's cache and ccache (FlashInfer's ninja launches nvcc and c++ through ccache).
ARG PARENT_IMAGE
FROM ${PARENT_IMAGE} AS builder

ARG PIP_SPECS=""
ARG BUILD_DEPS=""
ARG BUILD_ENV=""
ARG AOT_MODULES=""
ARG AOT_PATCHES="[]"
ARG AOT_LOCAL_VERSION=""
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_SPECS_LOCKED=""
ARG BUILD_DEPS_LOCKED=""

RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.cache/ccache \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    --mount=type=bind,target=/ctx \
    set -eu; \
    export CCACHE_DIR=/root/.cache/ccache CCACHE_MAXSIZE=20G CCACHE_COMPILERCHECK=content \
           FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-aot-ws; \
    if [ -n "${BUILD_ENV}" ]; then eval "export ${BUILD_ENV}"; fi; \
    test -n "${PIP_SPECS}" || { echo "METHOD=aot needs PIP_SPECS (the pinned flashinfer-python)" >&2; exit 2; }; \
    test -n "${AOT_MODULES}" || { echo "METHOD=aot needs AOT_MODULES (the recipe's modules list)" >&2; exit 2; }; \
    test -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" || { echo "No nvcc in ${CUDA_HOME:-/usr/local/cuda}/bin: an AOT build compiles CUDA; use a base with nvcc" >&2; exit 2; }; \
    mkdir -p /wheels; \
    if [ -n "${PIP_SPECS_LOCKED}" ]; then \
      echo "cudastack: PIP_SPECS in hash-checking mode (lockfile)"; \
      printf '%s\n' "${PIP_SPECS_LOCKED}" > /tmp/locked.txt; \
      with-build-ca pip download -q --no-deps --only-binary=:all: --require-hashes -d /wheels -r /tmp/locked.txt; \
    else \
      with-build-ca pip download -q --no-deps --only-binary=:all: -d /wheels ${PIP_SPECS}; \
    fi; \
    if [ -n "${BUILD_DEPS_LOCKED}" ]; then \
      echo "cudastack: BUILD_DEPS in hash-checking mode (lockfile)"; \
      printf '%s\n' "${BUILD_DEPS_LOCKED}" > /tmp/build-deps-locked.txt; \
      with-build-ca pip install -q --require-hashes --no-deps -r /tmp/build-deps-locked.txt; \
    else \
      with-build-ca pip install -q ${BUILD_DEPS:-${PIP_SPECS}}; \
    fi; \
    nice -n 10 python /ctx/aot/build_jit_cache.py --modules "${AOT_MODULES}" --patches "${AOT_PATCHES}" \
      --local-version "${AOT_LOCAL_VERSION}" --out /wheels; \
    rm -rf /tmp/flashinfer-aot-ws /tmp/flashinfer-aot-stage; \
    ccache -s 2>/dev/null | sed -n '1,12p' || true; \
    ls -l /wheels; \
    ls /wheels/flashinfer_jit_cache-*.whl >/dev/null

FROM scratch AS wheels
COPY --from=builder /wheels/ /
