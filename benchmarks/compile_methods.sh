#!/bin/bash
# Eager against --compile, ar and every method (issue 44 §3; RESULTS-cpu.md "Compiled static-shape decoding"), on
# this machine, float32, the same prompts: one eager run, then the compiled run with its trees rebuilt from a profile
# taken compiled (`profile --compile`) in a folder of its own, as benchmarks/gpu_pass.sh's graphs steps do on a GPU
# (a tree filed there is found before the checkout's; the eager run keeps the checkout's eager trees). Compile time
# lands in warm-up and run.yaml's `compile:` block, never in a timed turn. Run on a quiet machine:
#   LIMIT=5 TOK=64 bash benchmarks/compile_methods.sh
# METHODS ("-m ar -m pld ...") and TREE_METHODS ("ppd eagle ...") narrow it.
set -eu
LIMIT=${LIMIT:-5}; TOK=${TOK:-64}; OUT=$(mkdir -p "${OUT:-results/compile}" && cd "${OUT:-results/compile}" && pwd)
DATASETS=${DATASETS:-"-d gsm8k"}; WIDTHS=${WIDTHS:-1,2,3,4,5,6,8,12,16}
ROOT=$PWD; SB=$ROOT/.venv/bin/specbench; PY=$ROOT/.venv/bin/python
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$(cd .. && pwd)/shared/datasets}
M=${METHODS:-"-m ar -m pld -m sd -m ppd -m medusa -m hidden-transfer -m eagle -m parallelspec -m pearl -m suffix -m lookahead -m eagle3"}
RUN="$DATASETS --limit $LIMIT --max-new-tokens $TOK --dtype float32"
HW=$($PY -c "import torch; from specbench.core.machine.hardware import hardware_slug; print(hardware_slug(torch.device('cpu')))")

# 1. eager, the checkout's trees
$SB run $M $RUN --out "$OUT/eager"

# 2. a compiled profile, filed as this hardware's float32 profile in $OUT/store, and every tree rebuilt from it there
mkdir -p "$OUT/store/profiles/$HW"
$SB profile --dtype float32 --compile --widths "$WIDTHS" --kv-length 512 --out "$OUT/store/profiles/$HW/smollm2-135m-float32.yaml"
(cd "$OUT/store" && for m in ${TREE_METHODS:-ppd hidden-transfer medusa eagle parallelspec eagle3}; do
   $SB build-tree --method "$m" --gpu cpu --dtype float32 --kv-length 512 --max-size 16; done)

# 3. compiled, those trees (run from $OUT/store: its profile and trees are found first)
(cd "$OUT/store" && $SB run $M $RUN --compile --out "$OUT/compiled")
$PY benchmarks/compile_compare.py "$OUT/eager" "$OUT/compiled" | tee "$OUT/compare.txt"
