#!/usr/bin/env bash
# One entry point that does all set-up on a fresh Debian/Ubuntu machine, then runs what you ask:
#   bash scripts/dev.sh test                 # set up, then ruff, mypy (baseline) and the test suite
#   bash scripts/dev.sh build --cuda 13.1    # set up, then `invoke build --cuda 13.1` (any invoke task works)
# Set-up (idempotent): Debian's docker.io (+ mmdebstrap, debootstrap, docker-registry, skopeo, shellcheck, htpasswd, objdump,
# openssl, python3-venv, ca-certificates), a running Docker daemon, and a virtual environment .venv with this
# project installed (torch for CPU work included). `test` then runs pytest in CI mode: a skipped test fails
# unless it is marked gpu or stack (tests/require_all.py).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { printf '[setup] %s\n' "$*" >&2; }

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
[ -x /usr/bin/docker ] || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v mmdebstrap >/dev/null || need_pkgs+=(mmdebstrap)
command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)
command -v skopeo >/dev/null || need_pkgs+=(skopeo)
command -v htpasswd >/dev/null || need_pkgs+=(apache2-utils)
command -v shellcheck >/dev/null || need_pkgs+=(shellcheck)
command -v objdump >/dev/null || need_pkgs+=(binutils)
command -v openssl >/dev/null || need_pkgs+=(openssl)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need_pkgs+=(ca-certificates)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "Missing packages: ${need_pkgs[*]}. Run as root or: sudo apt-get install -y ${need_pkgs[*]}" >&2
    exit 5
  fi
  log "installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# The Docker daemon: start one when none answers.
if ! /usr/bin/docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "No Docker daemon answers and this user cannot start one: run 'sudo dockerd &' (or 'sudo systemctl start docker')." >&2
    exit 5
  fi
  log "starting dockerd (log: /tmp/cudastack-dockerd.log)"
  nohup dockerd >/tmp/cudastack-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 1; done
  /usr/bin/docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /tmp/cudastack-dockerd.log" >&2; exit 5; }
fi

# The project's virtual environment.
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import cudastack, stackprobe, invoke, docker, yaml, pytest, pytest_timeout, mypy, ruff' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
  log "installing the project into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  # The tests need torch only for CPU work (gloo process groups, reading torch's arch list); pin one
  # release so the resolver does not pick the newest CUDA build. Override with CUDASTACK_TEST_TORCH.
  .venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/pip install -q "torch==${CUDASTACK_TEST_TORCH:-2.13.0}"
  .venv/bin/pip install -q -e ".[dev]"
  touch .venv/.installed
fi
export PATH="$ROOT/.venv/bin:$PATH"

# The docker buildx plugin for the --builder tests only (tests/test_builder_integration.py reads it from
# CUDASTACK_TEST_BUILDX and puts it in a DOCKER_CONFIG of its own, so builds elsewhere keep their BuildKit path).
# Debian bookworm has no docker-buildx package; trixie's is taken with apt lists kept under .venv (the system's
# sources are not changed) and only its binary is unpacked.
BUILDX="$ROOT/.venv/libexec/docker-buildx"
if [ ! -x "$BUILDX" ] && ! /usr/bin/docker buildx version >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  log "fetching docker-buildx (Debian trixie package) for the --builder tests"
  apt_dir="$ROOT/.venv/apt-buildx"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$(dirname "$BUILDX")"
  echo "deb http://deb.debian.org/debian trixie main" > "$apt_dir/sources.list"
  apt_opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
            -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
  if apt-get -qq "${apt_opts[@]}" update >/dev/null 2>&1 \
     && (cd "$apt_dir" && apt-get -qq "${apt_opts[@]}" download docker-buildx >/dev/null 2>&1); then
    dpkg-deb -x "$apt_dir"/docker-buildx_*.deb "$apt_dir/root"
    cp "$apt_dir/root/usr/libexec/docker/cli-plugins/docker-buildx" "$BUILDX"
  else
    log "could not fetch docker-buildx: the --builder integration test will be skipped (a failure in CI mode)"
  fi
  rm -rf "$apt_dir"
fi
[ -x "$BUILDX" ] && export CUDASTACK_TEST_BUILDX="${CUDASTACK_TEST_BUILDX:-$BUILDX}"

cmd=${1:-test}
shift || true
case "$cmd" in
  test)
    # Everything the tests need was installed above: a skip is a failure here, apart from tests marked
    # gpu or stack (tests/require_all.py). CUDASTACK_REQUIRE_ALL=0 allows skips.
    export CUDASTACK_REQUIRE_ALL="${CUDASTACK_REQUIRE_ALL:-1}"
    # Lint and types first (seconds to two minutes): ruff clean; mypy's errors no more than the committed
    # baseline (scripts/mypy-baseline.txt, which only shrinks: `python scripts/mypy_baseline.py --update`).
    log "ruff check"
    python -m ruff check .
    log "mypy (against scripts/mypy-baseline.txt)"
    python scripts/mypy_baseline.py
    set +e
    python -m pytest -ra --durations=25 "$@"
    rc=$?
    set -e
    [ $rc -eq 5 ] && { echo "pytest collected no tests" >&2; exit 1; }
    exit $rc
    ;;
  bench)
    exec python benchmarks/"${1:-build_cache}".py "${@:2}"
    ;;
  *)
    exec invoke "$cmd" "$@"
    ;;
esac
