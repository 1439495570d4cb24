#!/bin/bash
# Engines side by side (issue 42; RESULTS-cpu.md "Engines"): specbench's own ar, pld and a learned method beside
# llama.cpp's ar, pld and sd on the same prompts, compared with `specbench report`; then llama-cpp-python's
# OpenAI-compatible server, prompt lookup on against off, at concurrency 1, 2 and 4. Run on a quiet machine.
#   LIMIT=20 TOK=128 LEARNED=parallelspec bash benchmarks/engines.sh
set -eu
LIMIT=${LIMIT:-20}; TOK=${TOK:-128}; LEARNED=${LEARNED:-parallelspec}; OUT=${OUT:-results/engines}
THREADS=${THREADS:-$(nproc)}; SERVER_LIMIT=${SERVER_LIMIT:-10}
SB=.venv/bin/specbench; PY=.venv/bin/python
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-../shared/datasets}
DATA="-d gsm8k -d humaneval --limit $LIMIT --max-new-tokens $TOK --threads $THREADS"
GGUF=$($PY -c "from specbench.core.model.gguf import embedded_gguf_path; print(embedded_gguf_path())")
DRAFT=${DRAFT:-$OUT/smollm2-135m-drafter-q8_0.gguf}
mkdir -p "$OUT"

# 1. specbench's own loop and llama.cpp in process, the same prompts
$SB run -m ar -m pld -m "$LEARNED" $DATA --dtype float32 --out "$OUT/specbench"   # float32: the issue compares its ar
if [[ -f "$DRAFT" ]]; then SD="-m sd --draft-model $DRAFT"; else SD=""; echo "no $DRAFT (docs/engines.md): sd left out"; fi
$SB run --engine llama.cpp -m ar -m pld $SD $DATA --out "$OUT/llamacpp"
$SB report "$OUT/specbench" "$OUT/llamacpp" --out "$OUT/compare"

# 2. llama-cpp-python's server: plain (the baseline) and with its prompt-lookup draft; extra weight buffers off (they
# crash llama.cpp 0.3.36 on the AMX Xeon: docs/engines.md)
LAUNCH='import llama_cpp, llama_cpp.llama as L
d = llama_cpp.llama_model_default_params
def p():
    x = d(); x.use_extra_bufts = False; return x
L.llama_cpp.llama_model_default_params = p
from llama_cpp.server.__main__ import main
main()'
COMMON="--model $GGUF --n_threads 1 --n_ctx 2048 --interrupt_requests False --verbose False"
$PY -c "$LAUNCH" $COMMON --port 8711 >/dev/null 2>&1 & PLAIN=$!
$PY -c "$LAUNCH" $COMMON --port 8712 --draft_model prompt-lookup-decoding --draft_model_num_pred_tokens 10 \
  >/dev/null 2>&1 & LOOKUP=$!
trap 'kill $PLAIN $LOOKUP 2>/dev/null' EXIT
for port in 8711 8712; do
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 1; done
done
$SB run --engine openai --base-url http://127.0.0.1:8712/v1 --baseline-url http://127.0.0.1:8711/v1 \
  --concurrency 1,2,4 -d gsm8k --limit "$SERVER_LIMIT" --max-new-tokens "$TOK" --out "$OUT/server"
