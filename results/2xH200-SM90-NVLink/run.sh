#!/usr/bin/env bash
# Five back-to-back runs of the whole runtime suite at world size 2 on a 2x H200 host, then the planted
# stale-output op (tests/test_runtime_fixture_probes.py) on GPU. Usage, from the repository root: bash results/2xH200-SM90-NVLink/run.sh OUTDIR
set -u
OUT=${1:?out}
export PYTHONPATH=$PWD/validate:$PWD/tests
T0=$(date +%s)
W=$(mktemp -d)
mkdir -p $W/runs
for i in 1 2 3 4 5; do
  S=$(date +%s)
  python3 -m stackprobe.runtime run --world-size 2 --label 2xH200-SM90-NVLink --out $W/runs/run$i > $W/runs/run$i.log 2>&1
  echo "run $i rc=$? seconds=$(( $(date +%s)-S ))" | tee -a $W/runs/summary.txt
  grep -v '^\[rank' $W/runs/run$i.log | grep -E '^  ' | grep -v skipped | tee -a $W/runs/summary.txt
  tar czf $OUT/runs.tgz -C $W runs
done
if [ $(( $(date +%s)-T0 )) -lt 500 ]; then
  S=$(date +%s)
  python3 -m stackprobe.runtime run --world-size 2 --probes nccl-default,test_runtime_fixture_probes:StaleUnderCaptureProbe \
    --sizes 43008 --repeats 5 --label 2xH200-SM90-NVLink --out $W/runs/stale-under-capture > $W/runs/stale.log 2>&1
  echo "stale rc=$? seconds=$(( $(date +%s)-S ))" | tee -a $W/runs/summary.txt
  grep -E '^  ' $W/runs/stale.log | tee -a $W/runs/summary.txt
fi
tar czf $OUT/runs.tgz -C $W runs
