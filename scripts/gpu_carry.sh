#!/bin/bash
# What scripts/gpu_sglang_state.sh needs carried to a GPU host that has torch + CUDA + NCCL and nothing
# downloadable, made from a lockfile's pins, in pieces that fit what one device call carries beside the tree.
#
#   bash scripts/gpu_carry.sh [LOCKFILE] [PIECE_MIB]     (defaults: lockfiles/13.1.lock.yaml, 40)
#
# Writes under .gpurun/ (git-ignored):
#   site.tar.xz.part-aa, -ab, ...  the lock's Python packages for CPython 3.12 (cp312 wheels, --no-deps), less
#                                  what the host has (torch, triton, torchvision, numpy, the nvidia-* and cuda-*
#                                  wheels), less what the parallel-state bring-up does not import (flash-attn,
#                                  FlashInfer, model hubs, API clients: EXCLUDE below), split in PIECE_MIB pieces;
#   site.tar.xz.sha256             the whole archive's sha256 (gpu_sglang_state.sh checks it after joining);
#   extra-sgl-kernel.tar.xz        the lock's sglang-kernel wheel with only what SGLang's import of `sgl_kernel`
#                                  loads on an SM90 host: sgl_kernel/sm90/common_ops and the Python files. Left
#                                  out (listed in extra-sgl-kernel.omitted): flash_ops.abi3.so (about 1 GiB, FA3,
#                                  imported lazily by sgl_kernel.flash_attn), flashmla_ops and infllm_ops (lazily
#                                  loaded), sm100/ (the SM100 build).
# Each piece travels in its own call (the host keeps ignored files between calls while warm).
# Exit status: 0 with the files written; 1 when the lock has no sglang pin or a download fails.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCK="${1:-$ROOT/lockfiles/13.1.lock.yaml}"
PIECE_MIB="${2:-40}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="$ROOT/.gpurun/build"
EXCLUDE='^(torch|torchvision|torchaudio|torchcodec|triton|nvidia-.*|cuda-.*|flashinfer-.*|sglang-kernel|pillow|numpy|sympy|networkx|mpmath|jinja2|markupsafe|fsspec|filelock|typing-extensions|setuptools|xgrammar|llguidance|z3-solver|outlines|outlines-core|openai-harmony|torch-memory-saver|torch-c-dlpack-ext|flash-attn|flash-attn-4|humming-kernels|sgl-deep-gemm|sgl-flash-mla|py-spy|pip|wheel|build|ninja|cython|modelscope|modelscope-hub|mistral-common|anthropic|pycountry|deepseek-recipe|timm|openai|nccl4py|nccl-extensions|cryptography|lxml|datasets|tml-renderers|sentencepiece|tiktoken|hf-xet|jedi|parso|kernels|kernels-data|pycryptodomex|gguf|zstandard|smg-grpc-proto|smg-grpc-servicer|scipy|pandas|pyarrow|numba|llvmlite|tilelang|nvshmem.*|deep-ep|sgl-deep-ep|grpcio|grpcio-.*|opencv-.*|decord|av|soundfile|scikit-.*|cupy-.*|nixl|mooncake-.*|quack-kernels|nvidia-cutlass-.*|cutlass-.*|apache-tvm|xformers)$'
PLATFORMS=(--python-version 3.12 --implementation cp --only-binary=:all:)
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 linux; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
rm -rf "$WORK" "$ROOT"/.gpurun/site.tar.xz.part-* "$ROOT/.gpurun/site.tar.xz.sha256"
mkdir -p "$WORK/wheels" "$WORK/site" "$WORK/sk"
"$PY" - "$LOCK" > "$WORK/pins.txt" <<'PY'
import sys, yaml
pins = {}
def walk(o):
    if isinstance(o, dict):
        if {"name", "version", "filename"} <= o.keys():
            pins[o["name"]] = o["version"]
        for v in o.values():
            walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
walk(yaml.safe_load(open(sys.argv[1])))
if "sglang" not in pins or "sglang-kernel" not in pins:
    sys.exit(f"{sys.argv[1]} pins no sglang / sglang-kernel: give a lockfile of a runtime with SGLang")
for k, v in sorted(pins.items()):
    print(f"{k}=={v}")
PY
grep -v -E "${EXCLUDE/)\$/)==}" "$WORK/pins.txt" > "$WORK/site.txt"
echo "$(wc -l < "$WORK/site.txt") of $(wc -l < "$WORK/pins.txt") pins go into the site"
"$PY" -m pip download -q --no-deps -d "$WORK/wheels" "${PLATFORMS[@]}" -r "$WORK/site.txt"
"$PY" -m pip install -q --no-deps --no-index --target "$WORK/site" "${PLATFORMS[@]}" "$WORK"/wheels/*.whl
rm -rf "$WORK/site/bin" "$WORK/site/share"
find "$WORK/site" -name __pycache__ -prune -exec rm -rf {} +
# test suites shipped inside packages (SGLang's own stays: its sglang.test helpers are imported)
find "$WORK/site" -mindepth 2 -path "$WORK/site/sglang" -prune -o -type d -name tests -prune -exec rm -rf {} +
du -sm "$WORK/site" | sed 's/\t.*/ MiB unpacked/'
tar -cf - -C "$WORK/site" . | xz -T0 -6 > "$ROOT/.gpurun/site.tar.xz"
(cd "$ROOT/.gpurun" && sha256sum site.tar.xz > site.tar.xz.sha256 && split -b "${PIECE_MIB}M" site.tar.xz site.tar.xz.part-)
rm -f "$ROOT/.gpurun/site.tar.xz"
sk="$(grep '^sglang-kernel==' "$WORK/pins.txt")"
"$PY" -m pip download -q --no-deps -d "$WORK/skwheel" "${PLATFORMS[@]}" "$sk"
(cd "$WORK/sk" && "$PY" -m zipfile -e "$WORK"/skwheel/*.whl .)
(cd "$WORK/sk" && ls sgl_kernel/flash_ops*.so sgl_kernel/flashmla_ops*.so sgl_kernel/infllm_ops*.so 2>/dev/null; echo sgl_kernel/sm100/) \
  > "$ROOT/.gpurun/extra-sgl-kernel.omitted"
(cd "$WORK/sk" && rm -rf sgl_kernel/flash_ops*.so sgl_kernel/flashmla_ops*.so sgl_kernel/infllm_ops*.so sgl_kernel/sm100)
tar -cf - -C "$WORK/sk" . | xz -T0 -6 > "$ROOT/.gpurun/extra-sgl-kernel.tar.xz"
rm -rf "$WORK"
ls -l --block-size=K "$ROOT"/.gpurun/site.tar.xz.part-* "$ROOT/.gpurun/extra-sgl-kernel.tar.xz"
