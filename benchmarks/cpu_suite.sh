#!/usr/bin/env bash
# The CPU benchmark suite behind benchmarks/RESULTS-cpu.md: every number there comes from these commands, run one
# after another on an otherwise idle machine (flock keeps other heavy jobs out). Output: results/cpu-suite/*.
# Usage: SPECBENCH_DATA_DIR=../shared/datasets bash benchmarks/cpu_suite.sh [step ...]   (default: every step)
set -uo pipefail
cd "$(dirname "$0")/.."
SB=".venv/bin/specbench"
OUT=results/cpu-suite
mkdir -p "$OUT"
LOCK=/tmp/specbench-cpu.lock
run() { echo "### $*" >&2; local t0=$SECONDS; flock "$LOCK" "$@"; echo "### exit $? after $((SECONDS - t0)) s" >&2; }

step_default() {  # the plain command of the Quick start
  run $SB run --out "$OUT/default"
}
step_generate() {  # ar against HF generate
  run .venv/bin/python benchmarks/ar_vs_hf_generate.py --limit 10 --max-new-tokens 128
}
step_ppd() {  # pld and ppd (tree: the one build-tree chose for this CPU) on four sets
  run $SB run --method pld --method ppd --dataset humaneval --dataset gsm8k --dataset mt-bench --dataset cnn-dm \
    --limit 6 --max-new-tokens 128 --out "$OUT/ppd-fp32"
}
step_pld() {  # prompt lookup on the three sets of the foundation issue, 10 prompts each
  run $SB run --method pld --dataset humaneval --dataset gsm8k --dataset cnn-dm --limit 10 --max-new-tokens 128 \
    --out "$OUT/pld-fp32"
}
step_estimate() {  # prompt-token accuracy (PPD Table 2), trained and initial, float32 and bfloat16
  for dt in float32 bfloat16; do
    run $SB estimate --method ppd --dtype $dt --out "$OUT/acceptance-trained-$dt.yaml"
    run $SB estimate --method ppd --dtype $dt --initial --out "$OUT/acceptance-initial-$dt.yaml"
  done
}
step_gsm100() {  # ppd against ar on the first 100 GSM8K problems (PPD issue's headline set)
  run $SB run --method ppd --dataset gsm8k --limit 100 --max-new-tokens 128 --out "$OUT/ppd-gsm8k100-fp32"
}
step_sd100() {  # sd against ar on the first 100 GSM8K problems (PEARL's set)
  run $SB run --method sd --dataset gsm8k --limit 100 --max-new-tokens 128 --out "$OUT/sd-gsm8k100-fp32"
}
step_draft() {  # the drafter methods and PEARL's ablations
  run $SB run --method sd --method pearl --method pearl-no-pre --method pearl-no-post --dataset humaneval \
    --dataset gsm8k --limit 8 --max-new-tokens 128 --out "$OUT/draft-fp32"
  run $SB run --method pearl --pearl-exec sequential --dataset humaneval --limit 8 --max-new-tokens 128 \
    --out "$OUT/pearl-sequential-fp32"
  run $SB run --method pearl --gamma 2 --dataset humaneval --dataset gsm8k --limit 8 --max-new-tokens 128 \
    --out "$OUT/pearl-gamma2-fp32"  # pearl at sd's gamma instead of round(c)
}
step_sweep() {  # measured speedup per tree size vs build-tree's prediction (PPD Fig. 8c)
  run $SB run --method ppd --tree-sizes 2,4,6,12,20 --dataset mt-bench --limit 20 --max-new-tokens 128 \
    --out "$OUT/ppd-sweep-fp32"
}
step_bf16() {
  run $SB run --method ppd --method pld --dtype bfloat16 --dataset humaneval --dataset gsm8k --limit 5 \
    --max-new-tokens 128 --out "$OUT/ppd-bf16"
}
step_shards() {  # issue 27: the same run unsharded (1 process x 2 threads) and on Ray (2 shards x 1 thread)
  local args=(--method pld --dataset gsm8k --limit 8 --max-new-tokens 96 --dtype float32)
  rm -rf "$OUT/shards-one" "$OUT/shards-ray"
  run $SB run "${args[@]}" --threads 2 --out "$OUT/shards-one"
  run $SB run "${args[@]}" --threads 1 --shards 2 --out "$OUT/shards-ray"
  .venv/bin/python benchmarks/same_tokens.py "$OUT/shards-one" "$OUT/shards-ray"
}
step_offload() {  # issue 27: the target with half its decoder layers offloaded to disk against the resident model
  .venv/bin/python benchmarks/offload_map.py --model smollm2-135m --disk-from 15 --out "$OUT/half-disk.json"
  for where in resident half-disk; do
    local map=(); [ $where = half-disk ] && map=(--device-map "$OUT/half-disk.json")
    run $SB profile --dtype float32 --threads 2 --widths 1,4,16,64 --kv-lengths 512 --repeats 5 "${map[@]}" \
      --out "$OUT/offload-profile-$where.yaml"
    rm -rf "$OUT/offload-run-$where"
    run $SB run --method pld --dataset gsm8k --limit 2 --max-new-tokens 48 --dtype float32 --threads 2 \
      --retime 0 "${map[@]}" --out "$OUT/offload-run-$where"
  done
  .venv/bin/python benchmarks/same_tokens.py "$OUT/offload-run-resident" "$OUT/offload-run-half-disk"
}
step_ems8() {  # issue 28: EMS-SD at B = 8 on CNN/DM, the fair padded baseline beside the unpadded engine
  rm -rf "$OUT/ems-b8"
  run $SB run --method pld --method sd --method eagle --dataset cnn-dm --limit 16 --max-new-tokens 64 \
    --batch-size 8 --batching both --dtype float32 --threads 2 --out "$OUT/ems-b8"
}
step_perb() {  # issue 28: L(B, w) for this CPU, then ppd's per-B tree choice (auto) beside the sizes it could choose
  run $SB profile --dtype float32 --threads 2 --batch-sizes 1,2,4,8
  rm -rf "$OUT/perb-ppd"
  run $SB run --method ppd --tree-sizes auto,2,4,8,16 --batch-size 1,2,4 --dataset gsm8k --limit 8 \
    --max-new-tokens 64 --dtype float32 --threads 2 --out "$OUT/perb-ppd"
  rm -rf "$OUT/perb-b2"  # B = 2 with three times the prompts: the first run's noise was larger than 5%
  run $SB run --method ppd --tree-sizes auto,2,4 --batch-size 2 --dataset gsm8k --limit 24 --max-new-tokens 64 \
    --dtype float32 --threads 2 --out "$OUT/perb-b2"
}

step_learned() {  # issue 29: the methods beside ar on 20 GSM8K + 20 HumanEval prompts (the retrained drafters' goal,
  # and the full run `recommend`'s pick is checked against; pearl, ~sd here, left out for time), then EAGLE-2's
  # dynamic tree in a run of its own (as deep as this hardware's static tree; RESULTS has depth 6's run too)
  rm -rf "$OUT/all-methods" "$OUT/dynamic"
  run $SB run --method pld --method sd --method ppd --method medusa --method hidden-transfer \
    --method eagle --method parallelspec --dataset gsm8k --dataset humaneval --limit 20 --max-new-tokens 128 \
    --dtype float32 --threads 2 --out "$OUT/all-methods"
  run $SB run --method eagle --tree dynamic --dataset gsm8k --dataset humaneval --limit 20 \
    --max-new-tokens 128 --dtype float32 --threads 2 --out "$OUT/dynamic"
}

step_drafters() {  # issue 29: the learned drafters and ppd alone beside ar (and pld) on the same 20 + 20 prompts as `learned`,
  # after retraining one of them (a shorter run than `learned`: no sd or dynamic tree)
  rm -rf "$OUT/drafters"
  run $SB run --method pld --method ppd --method medusa --method hidden-transfer --method eagle --method parallelspec \
    --dataset gsm8k --dataset humaneval --limit 20 --max-new-tokens 128 --dtype float32 --threads 2 \
    --out "$OUT/drafters"
}

step_recommend() {  # issue 29: recommend's pick on the first 20 GSM8K prompts (compare with all-methods' GSM8K rows)
  rm -rf "$OUT/recommend"
  run $SB recommend --dtype float32 --dataset gsm8k --limit 20 --max-new-tokens 128 --confirm 3 --threads 2 \
    --out "$OUT/recommend"
  .venv/bin/python benchmarks/recommend_check.py "$OUT/recommend/recommendation.yaml" "$OUT/all-methods"
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(default generate pld ppd gsm100 draft sd100 sweep bf16 estimate)
for s in "${steps[@]}"; do "step_$s"; done
