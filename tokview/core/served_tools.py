"""The tool declarations a server's template renders for a request, which are not always the request's `tools`.

SGLang (0.5.23) validates each tool into its `Tool` model and renders the model's dump, which holds
`"defer_loading": null` (about 20 more prompt ids a tool), and with `tool_choice: "none"` renders no tools at all
(`shared/recordings/tools/README.md` §8, bugs 4 and 5). vLLM renders them as sent. A local render that passes the
request's `tools` as they are differs from every SGLang prompt with tools (`prompt_render_mismatch` on healthy data).
"""

from __future__ import annotations

from typing import Any


def tools_as_served(tools: object, server_kind: str | None, tool_choice: object) -> list[Any] | None:
    """The `tools` the server's template renders (None: none)."""
    if not isinstance(tools, list) or not tools:
        return None
    if server_kind == "sglang":
        if tool_choice == "none":
            return None
        return [{**t, "defer_loading": None} if isinstance(t, dict) else t for t in tools]
    return tools
