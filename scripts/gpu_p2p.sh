#!/bin/bash
# The host section and the P2P check on this host (torch + CUDA and the driver installed, nothing downloadable):
#   1. `python -m stackprobe.host --world-size N --out $OUT/host`: GPUs and their PCIe tree, IOMMU mode, ACS on the
#      bridges between GPUs, NVML's P2P status, the driver and the variables that change the path (reads only);
#   2. `python -m stackprobe.runtime p2p --self-test --out $OUT/p2p`: per GPU pair a peer copy and a kernel-side
#      peer read/write, each in a child process with a timeout, checked against known data; with one GPU it says
#      there is nothing to pair and runs the same steps from the GPU to itself (the check's own machinery, not P2P);
#   3. the failing twins on the same devices: the check again with a planted wrong element in the kernel step and
#      with a planted stall in the copy (STACKPROBE_P2P_FAULT, read only by the check's child), which must read
#      wrong-data and hang (found within P2P_PLANTED_TIMEOUT, default 30 s, its children killed).
# Written to $OUT: versions.txt, topo.txt (nvidia-smi topo -m, where present), host/host.{json,md}, host.log,
# p2p/p2p-check.{json,md}, p2p.log, p2p-planted-{wrong,hang}/p2p-check.{json,md} with their logs, and summary.md
# (the pages and each command's exit status).
#
# Settings (environment): P2P_DEVICE=cuda|cpu (cpu: the same check on host memory, for a machine without a GPU),
# P2P_TIMEOUT seconds per step and pair (default 60), P2P_BYTES per transfer (default 256K), P2P_WORLD_SIZE for the
# host section's group (default: the GPUs visible, at least 1). Exit 0 when both wrote their JSON, else 1; the
# verdicts are in the pages, not in this script's status.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:?set OUT to the folder the reports go to}"
DEVICE="${P2P_DEVICE:-cuda}"
STEP_TIMEOUT="${P2P_TIMEOUT:-60}"
BYTES="${P2P_BYTES:-256K}"
mkdir -p "$OUT"
cd "$ROOT" || exit 1
export PYTHONPATH="$ROOT/validate${PYTHONPATH:+:$PYTHONPATH}"
case "$DEVICE" in cuda|cpu) ;; *) echo "P2P_DEVICE=$DEVICE: write cuda or cpu" >&2; exit 2 ;; esac
case "$STEP_TIMEOUT" in ''|*[!0-9]*) echo "P2P_TIMEOUT=$STEP_TIMEOUT: write whole seconds, e.g. 60" >&2; exit 2 ;; esac

gpus=0
if command -v nvidia-smi > /dev/null; then
  gpus="$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')"
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 || true
fi
if [ "$DEVICE" = cpu ]; then n=2; else n="$gpus"; fi
world_size="${P2P_WORLD_SIZE:-$(( gpus > 1 ? gpus : 1 ))}"

python - <<'PY' > "$OUT/versions.txt" 2>&1
import platform, subprocess, sys
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())
except Exception as exc:  # noqa: BLE001 - a report line
    print("torch: not importable:", exc)
print("python", sys.version.split()[0], "kernel", platform.release())
try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,pci.bus_id,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30).stdout.strip()
    print(q or "nvidia-smi: no GPU listed")
except (OSError, subprocess.SubprocessError) as exc:
    print("nvidia-smi: not available:", exc)
PY

rc=0
timeout 300 python -m stackprobe.host --world-size "$world_size" --out "$OUT/host" > "$OUT/host.log" 2>&1
host_rc=$?
echo "host section (world size $world_size): exit $host_rc (0 no risk, 3 a risk, 4 not judged)"
python -c "import json,sys; json.load(open(sys.argv[1]))" "$OUT/host/host.json" 2> /dev/null || rc=1

# every pair runs two steps (plus the self-test's two on one device), each bounded by STEP_TIMEOUT
pairs=$(( n * (n - 1) / 2 ))
budget=$(( (2 * pairs + 2) * (STEP_TIMEOUT + 15) + 60 ))
timeout "$budget" python -m stackprobe.runtime p2p --device "$DEVICE" --timeout "$STEP_TIMEOUT" --bytes "$BYTES" \
  --self-test --out "$OUT/p2p" > "$OUT/p2p.log" 2>&1
p2p_rc=$?
echo "p2p check ($DEVICE, $pairs pair(s), $STEP_TIMEOUT s a step): exit $p2p_rc (0 passed or nothing to pair, 1 a pair failed)"
python -c "import json,sys; json.load(open(sys.argv[1]))" "$OUT/p2p/p2p-check.json" 2> /dev/null || rc=1

# the failing twins: pair 0-1, or the device to itself with one device
if [ "$n" -ge 2 ]; then pair=0-1; devs=0,1; elif [ "$n" -eq 1 ]; then pair=0-0; devs=0; else pair=""; fi
planted=()
if [ -n "$pair" ]; then
  for twin in "wrong corrupt:$pair:kernel" "hang hang:$pair:copy"; do
    name="${twin%% *}"
    STACKPROBE_P2P_FAULT="${twin#* }" timeout 600 python -m stackprobe.runtime p2p --device "$DEVICE" \
      --devices "$devs" --timeout "${P2P_PLANTED_TIMEOUT:-30}" --bytes "$BYTES" --repeats 2 --self-test \
      --out "$OUT/p2p-planted-$name" > "$OUT/p2p-planted-$name.log" 2>&1
    planted+=("- planted $name (STACKPROBE_P2P_FAULT=${twin#* }, devices $devs): exit $? (must be 1)")
    echo "${planted[-1]}"
  done
fi

{
  echo "# Host section and P2P check"
  echo
  echo "- \`python -m stackprobe.host --world-size $world_size\`: exit $host_rc (0 no risk, 3 a risk, 4 not judged)"
  echo "- \`python -m stackprobe.runtime p2p --device $DEVICE --timeout $STEP_TIMEOUT --bytes $BYTES --self-test\`:" \
       "exit $p2p_rc (0 every pair passed or nothing to pair, 1 a pair or the self-test failed)"
  echo
  cat "$OUT/versions.txt"
  echo
  cat "$OUT/host/host.md" 2> /dev/null || echo "(no host page: see host.log)"
  echo
  cat "$OUT/p2p/p2p-check.md" 2> /dev/null || echo "(no P2P check page: see p2p.log)"
  echo
  echo "## Failing twins (planted faults)"
  echo
  printf '%s\n' "${planted[@]:-- none: no device to plant on}"
  for name in wrong hang; do
    [ -f "$OUT/p2p-planted-$name/p2p-check.md" ] && { echo; sed 's/^# /### planted '"$name"': /' \
      "$OUT/p2p-planted-$name/p2p-check.md"; }
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
exit "$rc"
