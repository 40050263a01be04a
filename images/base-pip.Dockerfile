# Base node, kind "base-pip": an OS image + a Python venv at /opt/venv + the CUDA toolkit from PyPI's wheels,
# laid out as a working CUDA_HOME at /usr/local/cuda. Needs no registry: OS_IMAGE may be a local tag made by
# debootstrap + docker import (cudastack.bootstrap). Debian/Ubuntu only (apt).
#
# Build args (contract: cudastack/model.py):
#   OS_IMAGE         local tag of the OS image, e.g. cudastack/debian:bookworm-20260711
#   CUDA_PIP_SPECS   space separated toolkit requirements, e.g. "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm,nvrtc]==13.1.1"
#   CUDA_VERSION     "13.1.1": checked against `nvcc --version` (major.minor) when the wheels carry nvcc
#   CUDA_WHEEL_ROOT  "nvidia/cu13" (CUDA 13 wheels share one prefix) or "" (CUDA 12: one folder per component,
#                    merged into /usr/local/cuda as symlinks)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional index for pip (no login: that is the secret pipindex)
#   VENV_PIP_SPECS_LOCKED, CUDA_PIP_SPECS_LOCKED   optional (locked builds): hash-checking requirements text
#                    that replaces VENV_PIP_SPECS / CUDA_PIP_SPECS (pip --require-hashes --no-deps)
# Secret (optional): id=cabundle, a CA bundle for an intercepting HTTPS proxy; used by pip/git/curl through
# /usr/local/bin/with-build-ca and never written to a layer; id=pipindex, a private index URL with its login, which
# with-build-ca exports as PIP_INDEX_URL (never a build arg: build args persist in the image history).
#
# The toolkit wheels go to their own prefix (/opt/cuda-wheels), not into the venv: torch from PyPI pins its own
# cuda-toolkit version (e.g. torch 2.11 -> cuda-toolkit==13.0.2) and brings its own runtime libraries, as on
# NVIDIA's images, so the compiler toolkit and torch's runtime never have to agree in one pip environment.
#
# What the wheels lack and this file adds (measured with cuda-toolkit 13.1.1):
#   * lib64 -> lib: nvcc.profile passes -L$(TOP)/lib64 and -L$(TOP)/lib64/stubs, the wheels ship lib/.
#   * unversioned lib*.so links (libcudart.so -> libcudart.so.13, libnvrtc.so, ...): `-lcudart` fails without.
#   * lib/stubs/libcuda.so: no wheel carries the driver stub, and links with `-lcuda` (FlashInfer's JIT modules,
#     driver-API extensions) fail without it. It is generated from the wheel's cuda.h: every cu* entry point,
#     returning CUDA_ERROR_STUB_LIBRARY (34), SONAME libcuda.so.1, like NVIDIA's stub. It sits only under stubs/
#     (never on LD_LIBRARY_PATH), so at run time the driver's libcuda.so.1 is the one loaded.
#   * CPLUS_INCLUDE_PATH=$CUDA_HOME/include/cccl: CUDA 13 moved thrust/cub/libcu++ to include/cccl. nvcc adds it
#     itself (nvcc.profile SYSTEM_INCLUDES), host-only C++ compiled by g++ does not (case C7); CPLUS_INCLUDE_PATH
#     entries behave like -isystem (GCC manual, "Environment Variables"), so no new warnings.
#   * CUDA 12 wheels carry no nvcc (nvidia-cuda-nvcc-cu12 ships only ptxas): /usr/local/cuda/NO_NVCC says so
#     (validation reports it; the planner refuses source recipes on such a base).
ARG OS_IMAGE
FROM ${OS_IMAGE}

ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG VENV_PIP_SPECS="pip==25.3 setuptools==80.9.0 wheel==0.45.1 ninja==1.13.0 packaging==25.0"

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1

# OS packages: Python (>= 3.11 for sglang; bookworm has 3.11), a host compiler for nvcc, git for git refs,
# ccache for source builds, binutils (readelf) for inspecting shared objects.
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    set -eu; \
    rm -f /etc/apt/apt.conf.d/docker-clean; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends \
        python3 python3-venv python3-dev g++ make git ccache binutils ca-certificates >/dev/null; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'

# with-build-ca CMD...: runs CMD with the BuildKit secret "cabundle" as the CA bundle for pip, requests, git,
# curl and OpenSSL when the secret is mounted; drops empty PIP_INDEX_URL / PIP_EXTRA_INDEX_URL.
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
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# *_LOCKED (set by `invoke build --locked`, cudastack.lock.locked_build_args): the lock's whole closure as a
# hash-checking requirements file (`name==version --hash=sha256:...` lines). pip then runs with
# --require-hashes --no-deps: any file whose sha256 differs from the lock stops the build, naming the package.
ARG VENV_PIP_SPECS_LOCKED=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    set -eu; \
    if [ -n "${VENV_PIP_SPECS_LOCKED}" ]; then \
        echo "cudastack: VENV_PIP_SPECS in hash-checking mode (lockfile)"; \
        printf '%s\n' "${VENV_PIP_SPECS_LOCKED}" > /tmp/venv-locked.txt; \
        with-build-ca pip install -q --require-hashes --no-deps -r /tmp/venv-locked.txt; \
        rm -f /tmp/venv-locked.txt; \
    else \
        with-build-ca pip install -q ${VENV_PIP_SPECS}; \
    fi

# The CUDA toolkit from PyPI, in its own prefix, exposed as /usr/local/cuda. (The CUDA args are declared
# here, not at the top, so the OS and venv layers above are shared by every toolchain's base.)
ARG CUDA_VERSION
ARG CUDA_PIP_SPECS
ARG CUDA_WHEEL_ROOT=""
ARG CUDA_PIP_SPECS_LOCKED=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    set -eu; \
    test -n "${CUDA_VERSION}" || { echo "build arg CUDA_VERSION is empty (expected e.g. 13.1.1)" >&2; exit 2; }; \
    test -n "${CUDA_PIP_SPECS}" || { echo "build arg CUDA_PIP_SPECS is empty (expected e.g. cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.1.1)" >&2; exit 2; }; \
    if [ -n "${CUDA_PIP_SPECS_LOCKED}" ]; then \
        echo "cudastack: CUDA_PIP_SPECS in hash-checking mode (lockfile)"; \
        printf '%s\n' "${CUDA_PIP_SPECS_LOCKED}" > /tmp/cuda-locked.txt; \
        with-build-ca pip install -q --no-compile --require-hashes --no-deps --target /opt/cuda-wheels -r /tmp/cuda-locked.txt; \
        rm -f /tmp/cuda-locked.txt; \
    else \
        with-build-ca pip install -q --no-compile --target /opt/cuda-wheels ${CUDA_PIP_SPECS}; \
    fi; \
    if [ -n "${CUDA_WHEEL_ROOT}" ]; then \
        test -d "/opt/cuda-wheels/${CUDA_WHEEL_ROOT}" || { echo "CUDA_WHEEL_ROOT=${CUDA_WHEEL_ROOT} is not in the installed wheels; found: $(ls /opt/cuda-wheels/nvidia)" >&2; exit 2; }; \
        ln -s "/opt/cuda-wheels/${CUDA_WHEEL_ROOT}" /usr/local/cuda; \
    else \
        mkdir -p /usr/local/cuda; \
        for d in /opt/cuda-wheels/nvidia/*/; do cp -rsf "$d". /usr/local/cuda/; done; \
        find /usr/local/cuda \( -name __init__.py -o -name __pycache__ \) -prune -exec rm -rf {} +; \
    fi; \
    cd /usr/local/cuda; \
    mkdir -p lib; \
    [ -e lib64 ] || ln -s lib lib64; \
    for f in lib/lib*.so.*; do \
        [ -e "$f" ] || continue; \
        link="${f%%.so.*}.so"; [ -e "$link" ] || ln -s "${f##*/}" "$link"; \
    done; \
    if [ -f include/cuda.h ] && [ ! -e lib/stubs/libcuda.so ]; then \
        mkdir -p lib/stubs; \
        gcc -E -P -x c -Iinclude include/cuda.h \
          | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d ' (' | sort -u \
          | sed 's/.*/int &(void) { return 34; }/' > /tmp/libcuda_stub.c; \
        test -s /tmp/libcuda_stub.c; \
        gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o lib/stubs/libcuda.so /tmp/libcuda_stub.c; \
        rm -f /tmp/libcuda_stub.c; \
    fi; \
    if [ -x bin/nvcc ]; then \
        want="release ${CUDA_VERSION%.*},"; \
        bin/nvcc --version | grep -q "$want" || { echo "nvcc is not CUDA ${CUDA_VERSION}: $(bin/nvcc --version | tail -2)" >&2; exit 2; }; \
    else \
        printf '%s\n' "The CUDA ${CUDA_VERSION} toolkit wheels (${CUDA_PIP_SPECS}) carry no nvcc." \
          "This CUDA_HOME holds only what the wheels ship (runtime, nvrtc, ptxas...): it can run and JIT-link," \
          "not compile CUDA sources. Use the nvidia base (nvidia/cuda:<version>-devel-*) to build from source." > NO_NVCC; \
    fi; \
    ls -l /usr/local/cuda/ /usr/local/cuda/bin/ 2>/dev/null | head -40

ENV CUDA_HOME=/usr/local/cuda \
    CUDA_VERSION=${CUDA_VERSION} \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
    CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

LABEL org.cudastack.kind="base-pip" \
      org.cudastack.cuda.version="${CUDA_VERSION}" \
      org.cudastack.cuda.pip-specs="${CUDA_PIP_SPECS}"

WORKDIR /root
CMD ["/bin/bash"]
