"""Production decoders (what the user's `--engine` picks) as backends of specbench's runner (run/backend.py names
them), so one report compares them with specbench's own methods: `--engine llama.cpp` (llama-cpp-python in
process: llama_cpp.py, its hooks llama_hooks.py, its files and machine probe llama_files.py) and `--engine openai`
(any OpenAI-compatible server: openai_*.py). Each writes the same run folder as specbench's own methods (run.yaml,
records.csv, tokens.jsonl), so the same report, noise guard, merge and CI gates read it."""

