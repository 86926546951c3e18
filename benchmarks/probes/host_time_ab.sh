# One device call (carry build/ab_base, made by: mkdir -p build/ab_base && git archive 3fcab47 flashlib | tar -x -C build/ab_base):
# benchmarks/probes/host_time_probe.py on that tree and this one, alternating. Writes $OUT/host_time_ab_vs_3fcab47.log.
export PYTHONUNBUFFERED=1 FLASHLIB_AUTOTUNE=0
G="$(nvidia-smi --query-gpu=name --format=csv,noheader)"
{
echo "# $G, $(date -u +%F): host time A/B, benchmarks/probes/host_time_probe.py with PYTHONPATH=build/ab_base (flashlib of 3fcab47, the last short suite's) and PYTHONPATH=\$PWD (${HEAD_COMMIT:-this tree}), alternating, FLASHLIB_AUTOTUNE=0"
for r in 1 2; do
  for arm in head base; do
    if [ $arm = head ]; then P=$PWD; else P=$PWD/build/ab_base; fi
    echo "## round $r, $arm"
    PYTHONPATH=$P timeout 100 python benchmarks/probes/host_time_probe.py 2>&1 | grep -v Warning
  done
done
} > $OUT/host_time_ab_vs_3fcab47.log 2>&1
