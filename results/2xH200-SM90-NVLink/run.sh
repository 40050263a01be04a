#!/usr/bin/env bash
# How the reports in this folder were produced, on a host with 2 H200 GPUs (SM90, NVLink), torch 2.11+cu130.
# Usage: results/2xH200-SM90-NVLink/run.sh OUTDIR   (from the repository root; nothing is installed)
set -u
OUTDIR=${1:?output folder}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD/validate PYTHONUNBUFFERED=1
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
# nccl-tests is not installed here; a single-process graph timer (benchmarks/nccl_graph_allreduce.cu) stands in
( nvcc -O2 -o /tmp/nccl_graph_allreduce benchmarks/nccl_graph_allreduce.cu -I"$NCCL_DIR/include" \
    -L"$NCCL_DIR/lib" -l:libnccl.so.2 -Xlinker -rpath="$NCCL_DIR/lib" > /tmp/nvcc.log 2>&1 ) &
echo "nccl-tests all_reduce_perf: $(command -v all_reduce_perf || echo 'not installed')" | tee "$OUTDIR/run.log"
# 1. the runtime suite at world sizes 1 and 2
python3 -m stackprobe.runtime run --world-size 1,2 --repeats 10 --label 2xH200-SM90-NVLink --out "$OUTDIR" 2>&1 \
  | grep -v '^\[rank' | tee -a "$OUTDIR/run.log"
wait
# 2. the same NCCL Ring allreduce from one process driving both GPUs (nccl-tests' -g 2 -G 1 set-up)
{ cat /tmp/nvcc.log
  echo "## NCCL_ALGO=Ring"; NCCL_NVLS_ENABLE=0 NCCL_ALGO=Ring /tmp/nccl_graph_allreduce 2 122 20 32768 43008 65536 1048576
  echo "## NCCL_ALGO unset"; NCCL_NVLS_ENABLE=0 /tmp/nccl_graph_allreduce 2 122 20 32768 43008 65536 1048576
  echo "## NCCL_ALGO=Ring NCCL_GRAPH_MIXING_SUPPORT=0"
  NCCL_NVLS_ENABLE=0 NCCL_ALGO=Ring NCCL_GRAPH_MIXING_SUPPORT=0 /tmp/nccl_graph_allreduce 2 122 20 32768 43008 65536 1048576
} > "$OUTDIR/single_process.txt" 2>&1
# 3. diagnostics: NCCL's own choice of transport, channels and algorithms (NCCL_DEBUG=INFO)
STACKPROBE_KEEP_LOGS=1 python3 -m stackprobe.runtime run --probes nccl-ring --world-size 2 --sizes 43008 --iters 10 \
  --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=INIT,P2P,GRAPH,TUNING --out /tmp/dbg > /tmp/dbg.log 2>&1
grep -h "NCCL" /tmp/stackprobe-rt-*/rank0.log | grep -v -i "plugin\|bootstrap" | head -150 > "$OUTDIR/nccl_debug.txt"
