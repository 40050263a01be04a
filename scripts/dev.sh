#!/usr/bin/env bash
# One entry point that does all set-up on a fresh Debian/Ubuntu machine, then runs what you ask:
#   bash scripts/dev.sh test                 # set up, then ruff, mypy (baseline) and the whole test suite (30-55 min)
#   bash scripts/dev.sh test --fast          # every test that needs no Docker, registry or network (no root needed)
#   bash scripts/dev.sh build --cuda 13.1    # set up, then `invoke build --cuda 13.1` (any invoke task works)
#   bash scripts/dev.sh clean-tests          # free the test caches and the tests' cudastack-test/ images
#   bash scripts/dev.sh --keep-dockerd TASK  # keep the Docker daemon this script started (also CUDASTACK_KEEP_DOCKERD=1)
# Set-up (idempotent): Debian's docker.io (+ mmdebstrap, debootstrap, docker-registry, skopeo, shellcheck, htpasswd, objdump,
# openssl, python3-venv, ca-certificates), a running Docker daemon, and a virtual environment .venv with this
# project installed (torch for CPU work included). `test` then runs pytest in CI mode: a skipped test fails
# unless it is marked gpu or stack (tests/require_all.py). A Docker daemon this script started is stopped when
# its command ends, unless --keep-dockerd (then it says how to stop it). The test suite's disk need is checked
# first (scripts/test_footprint.py), its caches go to one folder ($CUDASTACK_TEST_CACHE, default
# ~/.cache/cudastack-tests) and a disk that filled during the run is reported as such.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { printf '[setup] %s\n' "$*" >&2; }

keep_dockerd=${CUDASTACK_KEEP_DOCKERD:-0}
if [ "${1:-}" = "--keep-dockerd" ]; then keep_dockerd=1; shift; fi
cmd=${1:-test}
shift || true
fast=0
fast_flag=()
if [ "$cmd" = test ] && [ "${1:-}" = "--fast" ]; then fast=1; fast_flag=(--fast); shift; fi

if [ "$cmd" = clean-tests ]; then
  exec python3 scripts/test_footprint.py clean
fi

# The test suite's disk need, before anything is installed or downloaded (exit 5 naming the place when short).
if [ "$cmd" = test ]; then
  python3 scripts/test_footprint.py preflight "${fast_flag[@]}"
fi

need_pkgs=()
need() { local p; for p in "${need_pkgs[@]}"; do [ "$p" = "$1" ] && return 0; done; need_pkgs+=("$1"); }
if [ $fast = 0 ]; then     # the fast lane needs no Docker, registry or system tools: only Python's venv
  { command -v dockerd >/dev/null && [ -x /usr/bin/docker ]; } || need docker.io
  command -v debootstrap >/dev/null || need debootstrap
  command -v mmdebstrap >/dev/null || need mmdebstrap
  command -v docker-registry >/dev/null || need docker-registry
  command -v skopeo >/dev/null || need skopeo
  command -v htpasswd >/dev/null || need apache2-utils
  command -v shellcheck >/dev/null || need shellcheck
  command -v objdump >/dev/null || need binutils
  command -v openssl >/dev/null || need openssl
  [ -s /etc/ssl/certs/ca-certificates.crt ] || need ca-certificates
fi
python3 -c 'import venv, ensurepip' 2>/dev/null || need python3-venv
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "Missing packages: ${need_pkgs[*]}. Run as root or: sudo apt-get install -y ${need_pkgs[*]}" >&2
    exit 5
  fi
  log "installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# The Docker daemon: start one when none answers (not for the fast lane); stop it when this script ends, unless
# asked to keep it.
dockerd_pid=
# shellcheck disable=SC2317  # called by the EXIT trap
stop_dockerd() {
  [ -n "$dockerd_pid" ] || return 0
  if [ "$keep_dockerd" = 1 ]; then
    log "dockerd (pid $dockerd_pid) started by this script keeps running: stop it with 'kill $dockerd_pid' (log: /tmp/cudastack-dockerd.log)"
    return 0
  fi
  log "stopping the dockerd this script started (pid $dockerd_pid; --keep-dockerd or CUDASTACK_KEEP_DOCKERD=1 keeps it)"
  kill -TERM "$dockerd_pid" 2>/dev/null || return 0
  # gone, or a zombie (it exited; this shell, busy in its EXIT trap, has not reaped it yet): stopped
  for _ in $(seq 1 30); do
    if ! kill -0 "$dockerd_pid" 2>/dev/null || grep -q '^State:[[:space:]]*Z' "/proc/$dockerd_pid/status" 2>/dev/null; then
      wait "$dockerd_pid" 2>/dev/null
      return 0
    fi
    sleep 1
  done
  log "dockerd (pid $dockerd_pid) still runs 30 s after SIGTERM; see /tmp/cudastack-dockerd.log"
}
trap stop_dockerd EXIT
if [ $fast = 0 ] && ! /usr/bin/docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "No Docker daemon answers and this user cannot start one: run 'sudo dockerd &' (or 'sudo systemctl start docker')." >&2
    exit 5
  fi
  log "starting dockerd (log: /tmp/cudastack-dockerd.log)"
  nohup dockerd >/tmp/cudastack-dockerd.log 2>&1 &
  dockerd_pid=$!
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
if [ $fast = 0 ] && [ ! -x "$BUILDX" ] && ! /usr/bin/docker buildx version >/dev/null 2>&1 && command -v apt-get >/dev/null; then
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

case "$cmd" in
  test)
    # Everything the tests need was installed above: a skip is a failure here, apart from tests marked
    # gpu or stack (tests/require_all.py). CUDASTACK_REQUIRE_ALL=0 allows skips.
    export CUDASTACK_REQUIRE_ALL="${CUDASTACK_REQUIRE_ALL:-1}"
    # The suite's caches in one folder, freed by `bash scripts/dev.sh clean-tests`.
    export CUDASTACK_TEST_CACHE="${CUDASTACK_TEST_CACHE:-$HOME/.cache/cudastack-tests}"
    export CUDASTACK_CACHE="${CUDASTACK_CACHE:-$CUDASTACK_TEST_CACHE/index}"
    export STACKPROBE_CACHE="${STACKPROBE_CACHE:-$CUDASTACK_TEST_CACHE/stackprobe}"
    export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$CUDASTACK_TEST_CACHE/pip}"
    export UV_CACHE_DIR="${UV_CACHE_DIR:-$CUDASTACK_TEST_CACHE/uv}"
    log "ruff check"
    python -m ruff check .
    if [ $fast = 1 ]; then
      # No Docker, registry or network for the whole run (tests/fast_lane.py): a test that needs one of them
      # without its marker fails, naming the marker.
      export CUDASTACK_FAST_LANE=1
      log "fast lane: every test not marked docker, registry, network, gpu or stack"
      set +e
      python -m pytest -ra --durations=15 -m "not docker and not registry and not network and not gpu and not stack" "$@"
      rc=$?
    else
      # Types (seconds to two minutes): mypy's errors no more than the committed baseline
      # (scripts/mypy-baseline.txt, which only shrinks: `python scripts/mypy_baseline.py --update`).
      log "mypy (against scripts/mypy-baseline.txt)"
      python scripts/mypy_baseline.py
      set +e
      if [ $# -eq 0 ] && [ "${CUDASTACK_TEST_LANES:-3}" = 3 ]; then
        # Three lanes at once (CUDASTACK_TEST_LANES=1 runs one pytest), each selection its own pytest with its own
        # temporary folder: the fast lane (no Docker, registry or network: tests/fast_lane.py makes every service
        # unreachable for it); the network lane (tests that need PyPI and nothing else; Docker unreachable for
        # them) as two shards of whole files (CUDASTACK_LANE_SHARD, tests/fast_lane.py), one from the start and
        # one after the fast lane; and here every test that needs Docker, the registry, a GPU or a stack. So no
        # more than three pytest processes share the two cores, and the CPU-bound readers fill what the Docker
        # builds and downloads leave idle. The wheel and venv caches the lanes share are made under a lock
        # (tests/validate_support.cache_lock). The selections partition the tests (tests/test_suite_lanes.py).
        fast_expr="not docker and not registry and not network and not gpu and not stack"
        net_expr="network and not docker and not registry and not gpu and not stack"
        # shard 1 starts after the fast lane (13 min cold): a clean-clone run did about 4.5 network tests a minute
        # per shard, so shard 0 takes about 60 tests more
        net_start="0,60"
        lane_dir=$(mktemp -d)
        log "three lanes: fast then network 1/2, and network 0/2, in the background (their output follows); Docker/registry/GPU here"
        (
          CUDASTACK_FAST_LANE=1 python -m pytest -ra --durations=15 -p no:cacheprovider --basetemp="$lane_dir/tmp" \
            -m "$fast_expr" > "$lane_dir/fast.log" 2>&1
          echo $? > "$lane_dir/fast.rc"
          CUDASTACK_NETWORK_LANE=1 CUDASTACK_LANE_SHARD=1/2 CUDASTACK_LANE_SHARD_START="$net_start" python -m pytest -ra --durations=15 -p no:cacheprovider \
            --basetemp="$lane_dir/net1-tmp" -m "$net_expr" > "$lane_dir/net1.log" 2>&1
          echo $? > "$lane_dir/net1.rc"
        ) &
        chain_pid=$!
        CUDASTACK_NETWORK_LANE=1 CUDASTACK_LANE_SHARD=0/2 CUDASTACK_LANE_SHARD_START="$net_start" python -m pytest -ra --durations=15 -p no:cacheprovider \
          --basetemp="$lane_dir/net0-tmp" -m "$net_expr" > "$lane_dir/net0.log" 2>&1 &
        net0_pid=$!
        python -m pytest -ra --durations=25 -m "not ($fast_expr) and not ($net_expr)"
        rc=$?
        rc_svc=$rc
        wait "$net0_pid"
        rc_net0=$?
        wait "$chain_pid"
        rc_fast=$(cat "$lane_dir/fast.rc" 2>/dev/null || echo 1)
        rc_net1=$(cat "$lane_dir/net1.rc" 2>/dev/null || echo 1)
        echo "================ the network lane, shard 0/2 (ran beside the lane above) ================"
        cat "$lane_dir/net0.log"
        echo "================ the network lane, shard 1/2 (ran after the fast lane) ================"
        cat "$lane_dir/net1.log"
        echo "================ the fast lane (ran beside the lane above) ================"
        cat "$lane_dir/fast.log"
        rm -rf "$lane_dir"
        for r in "$rc_net0" "$rc_net1" "$rc_fast"; do [ "$rc" -eq 0 ] && rc=$r; done
        echo "lanes: services lane exit $rc_svc, network lane exits $rc_net0 and $rc_net1, fast lane exit $rc_fast" >&2
      else
        python -m pytest -ra --durations=25 "$@"
        rc=$?
      fi
    fi
    python3 scripts/test_footprint.py after "${fast_flag[@]}"
    set -e
    [ "$rc" -eq 5 ] && { echo "pytest collected no tests" >&2; exit 1; }
    exit "$rc"
    ;;
  bench)
    set +e
    python benchmarks/"${1:-build_cache}".py "${@:2}"
    exit $?
    ;;
  *)
    # not exec: this script stops the dockerd it started when the task ends (the EXIT trap)
    set +e
    invoke "$cmd" "$@"
    exit $?
    ;;
esac
