# Node kind "image": pip-installs PIP_SPECS into /opt/venv of the parent image (e.g. the torch node).
#
# Build args (contract: cudastack/model.py):
#   PARENT_IMAGE   the image to extend (a base node or another image node)
#   PIP_SPECS      space separated pinned requirements, e.g. "torch==2.11.0"
#   BUILD_ENV      space separated K=V applied to the pip command (values with spaces shell-quoted; evaluated
#                  by /bin/sh as `export $BUILD_ENV`)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   optional (no login: secret pipindex), e.g. https://download.pytorch.org/whl/cu130
#   PIP_SPECS_LOCKED  optional (locked builds): the lock's closure of PIP_SPECS as hash-checking requirements
#                  (`name==version --hash=sha256:...` lines), installed with pip --require-hashes --no-deps
# Secrets (optional): id=cabundle (CA bundle; never in a layer), id=pipindex (a private index URL with its login,
# exported as PIP_INDEX_URL by with-build-ca; never a build arg, never in a layer). Cache mount: pip's cache.
ARG PARENT_IMAGE
FROM ${PARENT_IMAGE}

ARG PIP_SPECS
ARG BUILD_ENV=""
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_SPECS_LOCKED=""

RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=cabundle \
    --mount=type=secret,id=pipindex \
    set -eu; \
    test -n "${PIP_SPECS}" || { echo "build arg PIP_SPECS is empty: nothing to install" >&2; exit 2; }; \
    if [ -n "${BUILD_ENV}" ]; then eval "export ${BUILD_ENV}"; fi; \
    if [ -n "${PIP_SPECS_LOCKED}" ]; then \
        echo "cudastack: PIP_SPECS in hash-checking mode (lockfile)"; \
        printf '%s\n' "${PIP_SPECS_LOCKED}" > /tmp/locked.txt; \
        with-build-ca pip install --require-hashes --no-deps -r /tmp/locked.txt; \
        rm -f /tmp/locked.txt; \
    else \
        with-build-ca pip install ${PIP_SPECS}; \
    fi
