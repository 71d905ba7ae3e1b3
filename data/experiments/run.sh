#!/usr/bin/env bash
# The training experiments of notebooks 06b and 05c (precision), as committed under data/experiments/ (one thread each:
# the notebook's live check re-runs their first steps with the same thread count and compares exactly).
# Each resumes from its progress file if interrupted: run the same line again.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMON=(--seeds 3 --eval-prompts 24 --threads 1 --no-progress --keep-progress
        --set num_prompts=4 num_generations=8 learning_rate=0.0002 per_sample_grad_norms=false)
case "${1:-all}" in  # pitfalls | pitfalls_more | fixed_seeds | tracin | tracin_sets | tracin_seeds | tracin_sets_seeds | zero_loss | confirm | precision | control_lr | control | all
  pitfalls|all)  # K = 36: the fixed arm's held-out reward did not move measurably at K = 12
    python -m grpo_debug train --steps 36 --eval-every 6 --arm fixed --arm trl --arm no_temperature \
      --arm eos_dropped --arm dropout "${COMMON[@]}" --json data/experiments/pitfalls.json ;;&
  pitfalls_more|all)  # the other pitfalls, a separate run sharing the machine; fixed is the same in both
    python -m grpo_debug train --steps 36 --eval-every 6 --arm fixed --arm no_position_ids --arm k1 \
      --arm reinforce "${COMMON[@]}" --json data/experiments/pitfalls_more.json ;;&
  fixed_seeds|all)  # does the fixed arm itself move by K = 36? Its seed-to-seed spread needs more than 3 seeds
    python -m grpo_debug train --steps 36 --eval-every 6 --arm fixed "${COMMON[@]}" --seeds 8 \
      --json data/experiments/fixed_seeds.json ;;&
  tracin|all)  # the sign: vanilla GRPO is the pitfalls run's fixed arm (same base, K, seeds: merge_results pairs them)
    python -m grpo_debug train --steps 36 --eval-every 6 --arm tracin --arm tracin_flipped \
      "${COMMON[@]}" --json data/experiments/tracin.json ;;&
  tracin_sets|all)  # the validation set: a separate run, so that the two share the machine
    python -m grpo_debug train --steps 36 --eval-every 6 --arm tracin_same_batch --arm tracin_top16 --arm tracin_random128 \
      "${COMMON[@]}" --json data/experiments/tracin_sets.json ;;&
  tracin_seeds|all)  # the TracIn-sign report's claim on 8 seeds, paired with fixed_seeds.json (seeds 0-2 are tracin.json's)
    python -m grpo_debug train --steps 36 --eval-every 6 --arm tracin "${COMMON[@]}" --seeds 8 \
      --json data/experiments/tracin_seeds.json ;;&
  tracin_sets_seeds|all)  # the same-batch TracIn report's claims on 8 seeds (seeds 0-2 are tracin_sets.json's)
    python -m grpo_debug train --steps 36 --eval-every 6 --arm tracin_same_batch --arm tracin_top16 "${COMMON[@]}" \
      --seeds 8 --json data/experiments/tracin_sets_seeds.json ;;&
  zero_loss|all)
    python -m grpo_debug train --steps 4 --eval-every 4 --arm fixed --arm dapo --arm identical_groups "${COMMON[@]}" \
      --json data/experiments/zero_loss.json ;;&
  confirm|all)  # the confirmatory run of plan.json (committed before it ran): its two commands, as written there
    python -c 'import json, shlex, subprocess, sys
for command in json.load(open("data/experiments/plan.json"))["commands"]:
    subprocess.run([sys.executable, *shlex.split(command)[1:]], check=True)' ;;&
  precision|all)  # notebook 05c's sampler-precision run of precision_plan.json (committed before it ran), as written
    # there, with the summed sequence ratio it ran with (the mean became the default after it)
    python -c 'import json, shlex, subprocess, sys
for command in json.load(open("data/experiments/precision_plan.json"))["commands"]:
    command = command.replace("--json", "vllm_importance_sampling_aggregation=sum --json")
    subprocess.run([sys.executable, *shlex.split(command)[1:]], check=True)' ;;&
  control_lr|all)  # the positive control's stage 1 (control_plan.json, committed before it ran): the learning rate,
    # chosen on validation prompts; its two commands side by side
    python -c 'import json, shlex, subprocess, sys
commands = json.load(open("data/experiments/control_plan.json"))["stage_1"]["commands"]
runs = [subprocess.Popen([sys.executable, *shlex.split(c)[1:]]) for c in commands]
sys.exit(max(r.wait() for r in runs))' ;;&
  control|all)  # its stage 2 at the rate stage 1 chose (grpo_debug.runs.control.chosen_rate), side by side
    python -c 'import json, shlex, subprocess, sys
from grpo_debug.runs.control import chosen_rate
lr = chosen_rate("data/experiments")
commands = json.load(open("data/experiments/control_plan.json"))["stage_2"]["commands"]
runs = [subprocess.Popen([sys.executable, *shlex.split(c.format(lr=lr))[1:]]) for c in commands]
sys.exit(max(r.wait() for r in runs))' ;;
esac
