# One device call: benchmarks/probes/short_regression_probe.py on build/ab_base (carried; see host_time_ab.sh) and this tree,
# alternating, autotuned. Writes $OUT/short_regression_ab.log.
export PYTHONUNBUFFERED=1
G="$(nvidia-smi --query-gpu=name --format=csv,noheader)"
{
echo "# $G, $(date -u +%F): bash benchmarks/probes/short_regression_ab.sh (build/ab_base = flashlib of 3fcab47; head = ${HEAD_COMMIT:-this tree}), autotuned"
for arm in head base head base; do
  if [ $arm = head ]; then P=$PWD; else P=$PWD/build/ab_base; fi
  echo "## $arm"
  PYTHONPATH=$P:$PWD/benchmarks timeout 150 python benchmarks/probes/short_regression_probe.py 2>&1 | grep -v Warning
done
} > $OUT/short_regression_ab.log 2>&1
