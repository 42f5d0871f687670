"""Capture clients for SGLang and vLLM, the server pool, feature detection, retries and the doctor.

Public API: `ServerPool`, `CaptureRequest`, `CaptureFailed`, `ServerUnreachable`; the doctor is in
`tokview.servers.doctor` (`run_doctor`). Each endpoint family is one `Backend` (backend.py), found in
`tokview.servers.registry` by (server kind, endpoint).
"""

from tokview.servers.errors import CaptureFailed, ServerUnreachable
from tokview.servers.info import ServerInfo
from tokview.servers.pool import ServerPool
from tokview.servers.request import CaptureRequest

__all__ = ["CaptureFailed", "CaptureRequest", "ServerInfo", "ServerPool", "ServerUnreachable"]
