#!/usr/bin/env bash
# CI tier: `tokview batch --ray` against a local Ray the tests start (ray.init(num_cpus=2)).
# Installs the optional `ray` extra into the CI venv, then runs only the tests marked `ray`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[test,ray]'
.venv/bin/python -m pytest -q -m ray tests/test_batch_ray.py
