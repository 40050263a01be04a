#!/bin/bash
# vLLM 0.33.0's parallel state at world size 1 on a one-GPU host (torch + CUDA 13 and NCCL installed, nothing
# downloadable): `python -m stackprobe.runtime.vllm_state` without and with VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1,
# both JSON outputs, their logs and versions.txt written to $OUT.
#
# What it reads, under the repository root (ignored folders, carried call by call: a warm machine keeps them):
#   .gpucarry/vllm-py.tar.xz          vllm's Python files from the 0.33.0 wheel with its dist-info (vLLM's platform
#                                     detection reads importlib.metadata.version("vllm") and falls back to no platform
#                                     without it) and vllm/third_party/pynvml.py (its NVML probe); no vllm-rs, no
#                                     other third_party, no .so. Made from `pip download vllm==0.33.0 --no-deps`:
#                                     unzip, drop vllm-rs/, vllm/third_party/* but __init__.py and pynvml.py, *.so and
#                                     the dist-info's RECORD, then tar | xz
#   .gpucarry*/so.xz.part-*           optional: the wheel's vllm/_C_stable_libtorch.abi3.so, xz-packed, in pieces
#                                     (one folder a call), joined in name order and checked against the
#                                     so.xz.sha256 beside one of them (the CUDA platform's
#                                     vllm/platforms/cuda.py imports it at the top)
#   .whl/*.whl                        the import closure's wheels the host lacks (tests/fixtures/
#                                     vllm_bring_up_requirements.txt less what the host has), for its Python
# VLLM_C_STANDIN=1 with no pieces carried: an empty module stands in for that extension (named in versions.txt).
# With DISPATCH_WORLD_SIZE=N (N >= 2 GPUs) it then runs `python -m stackprobe.runtime dispatch --engine vllm` at world
# size N, without and with the PCIe IPC opt-in, NVLink multicast off in every process. Exit 0 when both bring-up
# runs wrote their JSON, else 1.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:?set OUT to the folder the reports go to}"
SITE="${TMPDIR:-/tmp}/gpu-vllm-site"
mkdir -p "$SITE" "$OUT"
shopt -s nullglob
# shellcheck source=scripts/gpu_state_lib.sh
source "$ROOT/scripts/gpu_state_lib.sh"
tar -xJf "$ROOT/.gpucarry/vllm-py.tar.xz" -C "$SITE" || { echo "no .gpucarry/vllm-py.tar.xz to unpack" >&2; exit 1; }
parts=("$ROOT"/.gpucarry*/so.xz.part-*)
sums=("$ROOT"/.gpucarry*/so.xz.sha256)
if [ ${#parts[@]} -gt 0 ]; then
  cat "${parts[@]}" > "$SITE/so.xz"
  (cd "$SITE" && sha256sum -c --quiet "${sums[0]}") \
    || { echo "the joined so.xz does not match ${sums[0]:-so.xz.sha256}: a piece is missing or stale" >&2; exit 1; }
  xz -dc "$SITE/so.xz" > "$SITE/vllm/_C_stable_libtorch.abi3.so" || exit 1
fi
if [ ${#parts[@]} -eq 0 ] && [ "${VLLM_C_STANDIN:-0}" = 1 ]; then
  # the compiled extension not carried (92 MB): an empty module stands in for it, so vllm/platforms/cuda.py imports;
  # no op of it is called by the bring-up at world size 1 (no device communicator is built there), and the
  # versions file says so
  printf '"""Empty stand-in for vllm._C_stable_libtorch (not carried); registers no op."""\n' \
    > "$SITE/vllm/_C_stable_libtorch.py"
fi
install_wheels "$ROOT"/.whl/*.whl
export PYTHONPATH="$SITE:$ROOT/validate${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY' > "$OUT/versions.txt" 2>&1
import importlib.metadata as m, os, sys, torch
try: nccl = torch.cuda.nccl.version()
except Exception as e: nccl = f"unavailable ({e})"
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", nccl, "gpus", torch.cuda.device_count())
print("python", sys.version.split()[0])
for d in ("transformers", "pydantic", "flashinfer-python", "triton"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, "not installed")
so = os.path.join(os.environ["PYTHONPATH"].split(":")[0], "vllm", "_C_stable_libtorch.abi3.so")
stub = so.replace(".abi3.so", ".py")
print("vllm 0.33.0 (Python files of the wheel)", "with _C_stable_libtorch" if os.path.exists(so) else
      "with an EMPTY STAND-IN for _C_stable_libtorch (no op registered)" if os.path.exists(stub) else
      "without its .so files")
PY
cat "$OUT/versions.txt"
rc=0
state_run vllm default
state_run vllm pcie-ipc VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1
if [ "${DISPATCH_WORLD_SIZE:-1}" -ge 2 ]; then
  dispatch_run vllm default
  dispatch_run vllm pcie-ipc --env VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1
fi
exit $rc
