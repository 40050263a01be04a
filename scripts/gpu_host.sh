#!/bin/bash
# The host stage on a GPU host, as it is (nothing is changed on it): what a report's host section reads
# (`python -m stackprobe.host`), the data-checked P2P check (`python -m stackprobe.runtime p2p`), and the raw
# inputs beside them so the readers can be checked against what the host printed: /proc/cmdline, the NVIDIA
# devices' sysfs paths and iommu group types, `lspci -D -vvv` (when lspci is there), `nvidia-smi topo -m` and
# `nvidia-smi topo -p2p r`. Everything goes to $OUT. Run twice to show the per-pair statuses repeat.
# Needs only python with torch (CUDA) on the host; the suite comes from validate/ in this checkout.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH="$ROOT/validate${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT/raw"
nvidia-smi -L > "$OUT/raw/nvidia-smi-L.txt" 2>&1
nvidia-smi topo -m > "$OUT/raw/topo-m.txt" 2>&1
nvidia-smi topo -p2p r > "$OUT/raw/topo-p2p-r.txt" 2>&1
cat /proc/cmdline > "$OUT/raw/cmdline.txt" 2>&1
cat /proc/driver/nvidia/version > "$OUT/raw/driver-version.txt" 2>&1
if command -v lspci >/dev/null; then lspci -D -vvv > "$OUT/raw/lspci-vvv.txt" 2>&1; else echo "no lspci" > "$OUT/raw/lspci-vvv.txt"; fi
for d in /sys/bus/pci/devices/*; do
  [ "$(cat "$d/vendor" 2>/dev/null)" = "0x10de" ] || continue
  printf '%s -> %s class=%s iommu_group=%s type=%s config_bytes=%s\n' "$(basename "$d")" "$(readlink -f "$d")" \
    "$(cat "$d/class")" "$(basename "$(readlink "$d/iommu_group" 2>/dev/null)")" \
    "$(cat "$d/iommu_group/type" 2>/dev/null)" "$(wc -c < "$d/config" 2>/dev/null)"
done > "$OUT/raw/nvidia-sysfs.txt"
id > "$OUT/raw/id.txt"
rc=0
for run in 1 2; do
  python -m stackprobe.host --world-size 8 --out "$OUT/host-run$run" > "$OUT/host-run$run.log" 2>&1
  echo "host run $run: exit $?" >> "$OUT/exits.txt"
  timeout 300 python -m stackprobe.runtime p2p --out "$OUT/p2p-run$run" > "$OUT/p2p-run$run.log" 2>&1
  echo "p2p run $run: exit $?" >> "$OUT/exits.txt"
done
cat "$OUT/exits.txt"
exit $rc
