"""`tokview proxy` recording on threads of its own process (`ProxyConfig.record_in = "thread"`, what an embedding
program may choose) instead of its recorder child. Run as `python proxy_thread_recorder.py proxy ARGS…`."""

from __future__ import annotations

import sys

from tokview.proxy import serve

_original = serve.serve_forever


def _in_threads(config: serve.ProxyConfig) -> int:
    config.record_in = "thread"
    return _original(config)


if __name__ == "__main__":
    serve.serve_forever = _in_threads
    from tokview.cli import main

    sys.exit(main(sys.argv[1:]))
