#!/bin/bash
# The learning test's shortened default run (tests/test_learning.py: 16 problems per iteration, 12
# held-out problems, one thread, the adapter path the test's process takes) for 4 iterations with a
# greedy evaluation after each, for seeds 1-4 and both of the hf backend's samplers; two runs at a
# time on 2 cores. Writes runs/learning-test-seeds/<run>/ (remove it to run again);
# `python results/learning-test-seeds/summarise.py runs/learning-test-seeds` prints the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
unset OMP_WAIT_POLICY
run() {
  python marft.py --iterations 4 --batch_size 16 --eval_problems 12 --eval_samples 1 --eval_interval 1 --threads 1 \
    --no-merged_generation --seed "$1" --sampler "$2" --output_dir runs/learning-test-seeds --run_name "s$1-$2" > /dev/null
}
for pair in "1 inverse:2 multinomial" "2 inverse:3 multinomial" "3 inverse:4 multinomial" "4 inverse:1 multinomial"; do
  IFS=: read -r a b <<< "$pair"
  run $a & first=$!  # $a is "seed sampler": two arguments
  run $b & second=$!
  wait "$first"; wait "$second"  # each run's exit status, so that a failed run stops the script
done
