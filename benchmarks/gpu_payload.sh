#!/bin/bash
# Pack what a lent GPU machine (the workplace's `device` tool) needs to run specbench on the embedded model.
#
# A call sends the checkout plus named ignored folders, 64 MiB at most, and the machine has no network. The model's
# GGUF alone is 98 MB and the tracked drafter weights 43 MB, so they travel compressed (xz) in two halves, one per
# call, while the tracked *.safetensors are moved out of the tree for the two calls (they are inside the payload).
# The gguf package (transformers' GGUF reader) is not on that machine: its wheel travels too. Writes .gpu1/p1 and
# .gpu2/{p2,gpu_pass.sh} (both ignored through .git/info/exclude). Then, from the tool (first measured 2026-11-26 on
# an H200: start and the first call 54 s, the pass 498 s; benchmarks/RESULTS-gpu.md):
#   1. git ls-files '*.safetensors' | xargs rm
#   2. run  command: mkdir -p /tmp/stash && cp .gpu1/p1 /tmp/stash/      carry: [".gpu1"]
#   3. at once (a machine stays 30 s after a call):
#      run  command: DEADLINE=575 bash .gpu2/gpu_pass.sh 2>&1            carry: [".gpu2"]   timeout_s: 595
#   4. give_back; git checkout -- artifacts; rm -rf .gpu1 .gpu2; tar xzf the returned results.tgz somewhere
#
#   benchmarks/gpu_payload.sh        (from the checkout; needs .venv and SPECBENCH_DATA_DIR)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
: "${SPECBENCH_DATA_DIR:?set SPECBENCH_DATA_DIR to the datasets folder (gsm8k/, humaneval/)}"
LIMIT_BYTES=$((64 * 1024 * 1024))
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/payload" .git/info
for d in /.gpu1/ /.gpu2/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done

gguf=$(.venv/bin/python -c "from specbench.core.model.gguf import embedded_gguf_path; print(embedded_gguf_path())")
echo "model: $gguf"
xz -9 -T2 -c "$gguf" > "$work/payload/model.gguf.xz"
git ls-files '*.safetensors' | tar cf - -T - | xz -9 -T2 > "$work/payload/artifacts.tar.xz"
(cd "$SPECBENCH_DATA_DIR" && tar cf - gsm8k humaneval) | xz -9 > "$work/payload/datasets.tar.xz"
ver=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('gguf'))")
.venv/bin/pip download -q --no-deps --only-binary=:all: -d "$work/payload" "gguf==$ver"

# the tree that travels once the safetensors are out of it, and what is left for each half
tree=$(git ls-files --cached --others --exclude-standard | grep -v '\.safetensors$' | tr '\n' '\0' | xargs -0 du -cb | tail -1 | cut -f1)
half=$((LIMIT_BYTES - tree - 512 * 1024))
tar cf "$work/blob" -C "$work/payload" .
total=$(stat -c %s "$work/blob")
(( total <= 2 * half )) || { echo "payload $total bytes does not fit two calls of $half"; exit 1; }
rm -rf .gpu1 .gpu2; mkdir -p .gpu1 .gpu2
head -c "$half" "$work/blob" > .gpu1/p1
tail -c +"$((half + 1))" "$work/blob" > .gpu2/p2
cp benchmarks/gpu_pass.sh .gpu2/
echo "payload $total bytes: .gpu1/p1 $(stat -c %s .gpu1/p1), .gpu2/p2 $(stat -c %s .gpu2/p2); tree $tree bytes"
cat <<'STEPS'
next, from the device tool:
  1. git ls-files '*.safetensors' | xargs rm
  2. run  command: mkdir -p /tmp/stash && cp .gpu1/p1 /tmp/stash/      carry: [".gpu1"]
  3. at once: run  command: DEADLINE=575 bash .gpu2/gpu_pass.sh 2>&1   carry: [".gpu2"]   timeout_s: 595
  4. give_back; git checkout -- artifacts; rm -rf .gpu1 .gpu2; tar xzf the returned results.tgz somewhere
STEPS
