#!/usr/bin/env bash
# The live tier's tool-calling phase (issues 23 item 8, 24 item 7): real vLLM with the kimi_k2 reasoning and tool
# parsers serving, one after the other, two tiny Kimi-layout models built by tests/live/make_tiny_kimi.py:
#   tools: one call (get_weather), then a text answer once a result is in the prompt -> tests/live/test_live_tools.py
#          (exact ids, tool_calls vs the calls on ids, `tokview batch --history served`, `tokview proxy`);
#   agent: two parallel calls, a second round, then the answer -> tests/live/test_live_agent.py (the openai-client
#          agent harness, direct vs through the proxy);
#   turns: the same loop (3 rounds), then a second user turn with its own call and answer ->
#          tests/live/test_live_agent_turns.py (`tokview batch --history served` regenerates that trace, token-exact).
# Called by .ci/live.sh once the chain model's server is stopped; runs on its own too:
#
#   VLLM_VENV=.venv-vllm bash .ci/live_tools.sh
#
# Environment: PYTHON (tokview's venv python, default .venv/bin/python), VLLM_VENV (default .venv-vllm, made by
# .ci/live.sh), LIVE_PORT (default: a free port), LIVE_START_TIMEOUT (seconds, default 180), LIVE_TOOLS_MODELS
# (the models to serve, default "tools agent turns").
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
t0=$(date +%s)
phase_start=$t0
phase() {
  local now
  now=$(date +%s)
  echo "live-tools: $1 took $(( now - phase_start )) s"
  phase_start=$now
}
mkdir -p build
START_TIMEOUT=${LIVE_START_TIMEOUT:-180}
. .ci/vllm_server.sh
SERVER_PID=
trap 'if [ -n "$SERVER_PID" ]; then stop_server; fi' EXIT INT TERM

# serve_and_test MODE NAME TEST_FILE URL_ENV DIR_ENV: build the model (deterministic, a few seconds, checked in HF
# transformers: every turn's greedy output and that each prompt extends the previous prompt + output ids), serve it
# with the tool parser as the recordings were made (recordings/tools README; no prefix cache, so a greedy request
# computes the same way however often it is sent), run the tests, stop the server.
serve_and_test() {
  local mode=$1 name=$2 tests=$3 url_env=$4 dir_env=$5
  local model_dir="build/tiny-kimi-$mode" port
  LOG="build/vllm-$mode.log"
  HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 \
    "$VLLM_VENV/bin/python" tests/live/make_tiny_kimi.py "$model_dir" "$mode" bf16 --verify || return 1
  phase "$mode model build"
  port=${LIVE_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
  URL="http://127.0.0.1:$port"
  HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
    "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$model_dir" \
    --served-model-name "$name" --host 127.0.0.1 --port "$port" --max-model-len 2048 \
    --reasoning-parser kimi_k2 --tool-call-parser kimi_k2 --enable-auto-tool-choice \
    --no-enable-prefix-caching --enforce-eager >"$LOG" 2>&1 &
  SERVER_PID=$!
  wait_healthy "live-tools ($mode)"
  phase "$mode server start"
  set +e
  env "$url_env=$URL" "$dir_env=$model_dir" TOKVIEW_LIVE_TOOLS_RECORD="build/tools-live.json" \
    TOKVIEW_LIVE_TURNS_RECORD="build/turns-live.json" \
    "$PYTHON" -m pytest -m live "$tests" -q -p no:cacheprovider --durations=5 -o timeout=900
  local code=$?
  set -e
  phase "$mode tests"
  stop_server
  SERVER_PID=
  return $code
}

MODELS=" ${LIVE_TOOLS_MODELS:-tools agent turns} "
rc=0
rm -f build/tools-live.json build/turns-live.json
run_model() {  # MODE NAME TEST_FILE URL_ENV DIR_ENV, if MODE is asked for; the first failure's code is kept
  local code=0
  case "$MODELS" in *" $1 "*) ;; *) return 0 ;; esac
  serve_and_test "$@" || code=$?
  [ "$rc" != 0 ] || rc=$code
}
run_model tools tiny-kimi-tools tests/live/test_live_tools.py TOKVIEW_LIVE_TOOLS_URL TOKVIEW_LIVE_TOOLS_DIR
run_model agent tiny-kimi-agent tests/live/test_live_agent.py TOKVIEW_LIVE_AGENT_URL TOKVIEW_LIVE_AGENT_DIR
run_model turns tiny-kimi-turns tests/live/test_live_agent_turns.py TOKVIEW_LIVE_TURNS_URL TOKVIEW_LIVE_TURNS_DIR
if [ -s build/tools-live.json ]; then
  echo "live-tools: the tool model's two turns on the real server (prompt lengths, output ids, tool_calls):"
  cat build/tools-live.json
fi
if [ -s build/turns-live.json ]; then
  echo "live-tools: the turns model's chain on the real server (prompt and output lengths per turn):"
  cat build/turns-live.json
fi
echo "live-tools: total $(( $(date +%s) - t0 )) s"
exit $rc
