#!/bin/bash
# SGLang 0.5.23's parallel state at world size 1 on a one-GPU host (torch 2.11 + CUDA 13 and NCCL installed,
# nothing downloadable): `python -m stackprobe.runtime.sglang_state` without and with
# SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, both JSON outputs (and the host's P2P report) written to $OUT.
#
# The Python packages come carried in .gpurun/ under the repository root, as wheels (the transfer limit is
# 64 MiB a call, so they may come in two calls: every .gpurun/wheels*/*.whl present is unpacked, without
# dependencies, into .gpurun/site, which stays between calls on a warm machine). What the import needs beyond
# torch (found by importing it against --no-deps folders): see tests/test_runtime_sglang_dispatch.py
# PARALLEL_STATE_DEPS, plus transformers/tokenizers/safetensors/huggingface-hub/regex/pyyaml/httpx2/
# httpcore2/truststore/h11/compressed-tensors for runtime_context.publish (srt/configs) and uvloop for
# srt/entrypoints/engine (_set_envs_and_config). Exit status: 0 when both runs wrote their JSON, else 1.
#
# With DISPATCH_WORLD_SIZE=N (N >= 2 GPUs on the host) it then runs the SGLang dispatch probe at world size N
# (`python -m stackprobe.runtime dispatch`: which path serves a decode-shape all_reduce under SGLang's graph capture,
# timed paired against the same group with that path off), with SERVER_ARGS (default none), without and with
# SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, into $OUT/dispatch-default/ and $OUT/dispatch-pcie-ipc/. NVLink multicast is
# off in every process of those runs (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1;
# the ranks get them from the orchestrator too). DISPATCH_ARGS adds flags (e.g. "--rounds 30 --timeout 300").
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:?set OUT to the folder the reports go to}"
SITE="$ROOT/.gpurun/site"
mkdir -p "$SITE" "$OUT"
shopt -s nullglob
# shellcheck source=scripts/gpu_state_lib.sh
source "$ROOT/scripts/gpu_state_lib.sh"
# or the packages already unpacked and packed as one .gpurun/site.tar.xz (xz packs the Python text about 6x
# better than the wheels' zip: what fits in one call)
# or in pieces carried call by call (scripts/gpu_carry.sh: site.tar.xz.part-*, joined and checked against
# site.tar.xz.sha256 here), and extra-*.tar.xz archives (the trimmed sglang-kernel) unpacked beside it
parts=("$ROOT"/.gpurun/site.tar.xz.part-*)
if [ ${#parts[@]} -gt 0 ]; then
  cat "${parts[@]}" > "$ROOT/.gpurun/site.tar.xz"
  (cd "$ROOT/.gpurun" && sha256sum -c --quiet site.tar.xz.sha256) \
    || { echo "the joined .gpurun/site.tar.xz does not match site.tar.xz.sha256: a piece is missing or stale" >&2; exit 1; }
fi
for archive in "$ROOT/.gpurun/site.tar.xz" "$ROOT"/.gpurun/extra-*.tar.xz; do
  [ -f "$archive" ] || continue
  tar -xJf "$archive" -C "$SITE" || { echo "unpacking $archive failed" >&2; exit 1; }
done
install_wheels "$ROOT"/.gpurun/wheels*/*.whl
export PYTHONPATH="$SITE:$ROOT/validate${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY' > "$OUT/versions.txt" 2>&1
import importlib.metadata as m, torch
try: nccl = torch.cuda.nccl.version()
except Exception as e: nccl = f"unavailable ({e})"
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", nccl, "gpus", torch.cuda.device_count())
for d in ("sglang", "sglang-kernel", "transformers", "compressed-tensors", "torchvision", "triton", "pillow"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, "not installed")
PY
[ -f "$ROOT/.gpurun/extra-sgl-kernel.omitted" ] && sed 's/^/sglang-kernel file left out: /' "$ROOT/.gpurun/extra-sgl-kernel.omitted" >> "$OUT/versions.txt"
cat "$OUT/versions.txt"
# optional: which top-level modules the bring-up imports that are not here (a stub answers each, names recorded)
if [ -f "$ROOT/.gpurun/discover.py" ]; then
  timeout 300 python "$ROOT/.gpurun/discover.py" > "$OUT/discover.json" 2> "$OUT/discover.log"
  grep '^MISSING:' "$OUT/discover.log"
fi
python -m stackprobe.runtime.p2p --out "$OUT" > /dev/null || echo "the P2P report failed" >&2
rc=0
state_run sglang default
state_run sglang pcie-ipc SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1
if [ "${DISPATCH_WORLD_SIZE:-1}" -ge 2 ]; then
  dispatch_run sglang default --server-args="${SERVER_ARGS:-}"
  dispatch_run sglang pcie-ipc --server-args="${SERVER_ARGS:-}" --env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1
fi
exit $rc
