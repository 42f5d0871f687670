"""The live tier: a real vLLM serving the tiny Kimi-layout chain model (run by .ci/live.sh)."""
