export PYTHONUNBUFFERED=1 FLASHLIB_AUTOTUNE=0
G="$(nvidia-smi --query-gpu=name --format=csv,noheader)"
{
echo "# $G, 2026-11-26: host time A/B, benchmarks/host_time_probe.py with PYTHONPATH=build/ab_base (flashlib of 3fcab47, the last short suite's) and PYTHONPATH=\$PWD (commit 533ef99), alternating, FLASHLIB_AUTOTUNE=0"
for r in 1 2; do
  for arm in head base; do
    if [ $arm = head ]; then P=$PWD; else P=$PWD/build/ab_base; fi
    echo "## round $r, $arm"
    PYTHONPATH=$P timeout 100 python benchmarks/host_time_probe.py 2>&1 | grep -v Warning
  done
done
} > $OUT/host_time_ab_vs_3fcab47.log 2>&1
