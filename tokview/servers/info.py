"""What tokview knows about one server after probing it (kind, version, model, features)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServerInfo:
    """Filled by `features.detect`; `features` keys:

    `generate` (SGLang /generate works), `generate_ids` (it returns output_ids), `chat` (the chat
    endpoint answers), `chat_ids_field` (the name of the completion-id field on chat: `token_ids`,
    `response_token_ids`, `sglext.output_ids`, or None), `chat_prompt_ids_field` (where the prompt
    ids are: `prompt_token_ids` at the top or in the choice), `completions_ids` (vLLM /v1/completions
    with a token-id prompt returns ids), `reasoning_field` (the message key the parser fills),
    `tokenize_messages` (/tokenize takes messages), `simulator` (the server says it is tokview's
    simulator).
    """

    url: str
    kind: str = "unknown"
    kind_said: bool = False
    """The kind is what the server's info endpoints say it is (SGLang's /get_model_info, vLLM's /version), not
    inferred from which raw probe it answered (a gateway or a fake answering every path can pass either)."""
    version: str | None = None
    model: str | None = None
    features: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    """Raw probe answers (model info, server info), for the doctor."""
    max_model_len: int | None = None
    """The longest prompt + output the server takes, in tokens, as it reports it (None: not reported)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "kind": self.kind,
            "version": self.version,
            "model": self.model,
            "max_model_len": self.max_model_len,
            "features": dict(self.features),
        }

    def stamp(self) -> dict[str, Any]:
        """The Capture fields that say which server made it."""
        return {"server_url": self.url, "server_kind": self.kind, "server_version": self.version, "model": self.model}
