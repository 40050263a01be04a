# shellcheck shell=bash disable=SC2034
# Shared by scripts/gpu_sglang_state.sh and scripts/gpu_vllm_state.sh (sourced, not run): unpacking carried wheels,
# the two world-size-1 bring-up runs and the dispatch runs. Each function reads ROOT, OUT and SITE, and sets rc=1
# when a run wrote no report.

install_wheels() {  # install_wheels WHEEL...: unpack carried wheels, without dependencies, into $SITE
  [ $# -gt 0 ] || return 0
  python -m pip install -q --no-deps --no-index --disable-pip-version-check --target "$SITE" --upgrade "$@" \
    || { echo "unpacking the carried wheels into $SITE failed" >&2; exit 1; }
}

state_run() {  # state_run ENGINE NAME [VAR=VALUE ...]: python -m stackprobe.runtime.<ENGINE>_state at world size 1
  local engine="$1" name="$2"; shift 2
  env "$@" timeout 300 python -m "stackprobe.runtime.${engine}_state" --world-size 1 --backend nccl \
    > "$OUT/$engine-state-$name.json" 2> "$OUT/$engine-state-$name.log"
  echo "$name: exit $? ($(wc -c < "$OUT/$engine-state-$name.json") bytes of JSON)"
  python -c "import json,sys; json.load(open(sys.argv[1]))" "$OUT/$engine-state-$name.json" 2>/dev/null || rc=1
}

dispatch_run() {  # dispatch_run ENGINE NAME [FLAG ...]: the dispatch probe at world size $DISPATCH_WORLD_SIZE,
  # NVLink multicast off in this process and (through --env) in every rank
  local engine="$1" name="$2"; shift 2
  # shellcheck disable=SC2086
  env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 timeout 600 \
    python -m stackprobe.runtime dispatch --engine "$engine" --world-size "$DISPATCH_WORLD_SIZE" \
    --env NCCL_NVLS_ENABLE=0 --env TORCH_SYMM_MEM_DISABLE_MULTICAST=1 --env NVSHMEM_DISABLE_NVLS=1 \
    "$@" ${DISPATCH_ARGS:-} --out "$OUT/dispatch-$name" > "$OUT/dispatch-$name.log" 2>&1
  echo "dispatch $name (world size $DISPATCH_WORLD_SIZE): exit $?"
  [ -f "$OUT/dispatch-$name/dispatch.json" ] || rc=1
}
