# Sourced by the live scripts: stop and wait for the vLLM server they started in the background.
# Needs SERVER_PID, URL, LOG and START_TIMEOUT set by the caller; $1 of wait_healthy prefixes messages.

stop_server() {  # SIGTERM, up to 15 s to exit, then SIGKILL
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
  fi
}

wait_healthy() {  # poll /health once a second; on failure print the log's tail and exit 1
  local name=$1 up=0
  for _ in $(seq 1 "$START_TIMEOUT"); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "$name: vLLM exited during startup" >&2
      break
    fi
    if curl -sf -m 2 "$URL/health" >/dev/null 2>&1; then up=1; break; fi
    sleep 1
  done
  if [ "$up" != 1 ]; then
    echo "$name: vLLM did not become healthy at $URL within ${START_TIMEOUT} s; last log lines:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}
