#!/usr/bin/env bash
# The live tier's tool-calling phase (issues 23 item 8, 24 item 7): real vLLM serving tokview's tiny Kimi-layout
# *tool* model (tests/live/make_tiny_kimi.py, variant `tools`) with the kimi_k2 reasoning and tool parsers, and
# tests/live/test_live_tools.py + tests/live/test_live_agent.py run against it (batch, proxy, the openai-client
# agent harness). Called by .ci/live.sh once the chain model's server is stopped; runs on its own too:
#
#   VLLM_VENV=.venv-vllm bash .ci/live_tools.sh
#
# Environment: PYTHON (tokview's venv python, default .venv/bin/python), VLLM_VENV (default .venv-vllm, made by
# .ci/live.sh), LIVE_PORT (default: a free port), LIVE_START_TIMEOUT (seconds, default 180).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
MODEL_DIR=build/tiny-kimi-tools
LOG=build/vllm-tools.log
START_TIMEOUT=${LIVE_START_TIMEOUT:-180}
t0=$(date +%s)
phase_start=$t0
phase() {
  local now
  now=$(date +%s)
  echo "live-tools: $1 took $(( now - phase_start )) s"
  phase_start=$now
}
mkdir -p build

# 1. The model, built by our own code (deterministic, a few seconds) and checked in HF transformers: turn 1 calls
#    the tool, turn 2 answers, turn 2's prompt extends turn 1's prompt + output ids.
HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 \
  "$VLLM_VENV/bin/python" tests/live/make_tiny_kimi.py "$MODEL_DIR" tools bf16 --verify
phase "model build"

# 2. The server, with the tool parser as the recordings were made (recordings/tools README). No prefix cache, so
#    a greedy request computes the same way however often it is sent.
PORT=${LIVE_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
URL="http://127.0.0.1:$PORT"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
  "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
  --served-model-name tiny-kimi-tools --host 127.0.0.1 --port "$PORT" --max-model-len 2048 \
  --reasoning-parser kimi_k2 --tool-call-parser kimi_k2 --enable-auto-tool-choice \
  --no-enable-prefix-caching --enforce-eager >"$LOG" 2>&1 &
SERVER_PID=$!
. .ci/vllm_server.sh
trap stop_server EXIT INT TERM
wait_healthy live-tools
phase "server start"

# 3. The tests. `-m live` overrides the default `-m 'not live'`.
export TOKVIEW_LIVE_TOOLS_URL="$URL" TOKVIEW_LIVE_TOOLS_DIR="$MODEL_DIR"
export TOKVIEW_LIVE_TOOLS_RECORD="build/tools-live.json"
rm -f "$TOKVIEW_LIVE_TOOLS_RECORD"
set +e
"$PYTHON" -m pytest -m live tests/live/test_live_tools.py tests/live/test_live_agent.py -q -p no:cacheprovider \
  --durations=5 -o timeout=900
rc=$?
set -e
phase "tests"
if [ -s "$TOKVIEW_LIVE_TOOLS_RECORD" ]; then
  echo "live-tools: the tool model's two turns on the real server (prompt lengths, output ids, tool_calls):"
  cat "$TOKVIEW_LIVE_TOOLS_RECORD"
fi
echo "live-tools: total $(( $(date +%s) - t0 )) s"
exit $rc
