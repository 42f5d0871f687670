"""Feature detection at connect: what kind of server this is and which id fields it returns.

Field names differ by engine and build (protocols.md §1.8, §2.3, §5.5), so tokview asks instead of
assuming: the info endpoints say the kind, version and model; a 1-token request on each endpoint
says which id fields and which reasoning field really come back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from tokview.core.profiles import ModelProfile
from tokview.servers.backend import Probe
from tokview.servers.chat import PROBE_MESSAGES
from tokview.servers.errors import CaptureFailed, ServerUnreachable
from tokview.servers.http import CONNECTION_LOST, ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.registry import for_kind
from tokview.servers.retry import GaveUp, RetryPolicy
from tokview.servers.shapes import int_list
from tokview.untrusted_text import storable

T = TypeVar("T")


async def ask(policy: RetryPolicy, fn: Callable[[], Awaitable[T]]) -> tuple[T | None, str | None]:
    """(answer, None) or (None, why it failed); a dead server raises ServerUnreachable, and so does one that
    answered none of a probe's attempts within the timeout: the dozen probes after it would each wait as long
    (a server that accepted connections and never answered held a batch for ~54 timeouts, and was then said to
    answer "HTTP but neither SGLang nor vLLM")."""
    try:
        return await policy.run(fn), None
    except GaveUp as exc:
        if exc.last.connection:
            raise ServerUnreachable(exc.last.reason) from None
        if exc.last.timed_out:
            raise ServerUnreachable(exc.reason) from None
        return None, exc.reason
    except CaptureFailed as exc:
        return None, exc.reason


REDIRECTED = (": redirected to ", "still redirected after", "a redirect without a Location")
"""In a probe's failure (`http.ServerClient._redirect`): a redirect tokview does not follow (to another server, as a
GET without the body, in a loop, or nowhere), and its Location."""


AUTH_REFUSED = ("HTTP 401 ", "HTTP 403 ")
"""How a probe's failure starts when the server refused its credentials (`http.ServerClient`'s reasons)."""


def credentials_refused(info: ServerInfo) -> str | None:
    """Why the server cannot be used with tokview's credentials, for the one-line error; None when it took them."""
    refused = info.details.get("auth_refused")
    return f"{info.url} refused tokview's credentials ({refused[:120]}): {AUTH_HINT}" if refused else None


def unknown_server(info: ServerInfo, hint: str) -> str:
    """Why a server's kind is unknown, for the one-line error: no HTTP answer at all, a redirect elsewhere (with its
    Location: "neither SGLang nor vLLM" sent the user to --backend when --server was what to change), a refused key
    (a server started with --api-key answers 401 everywhere: the kind was not what to change), or info endpoints of
    neither kind (then `hint`)."""
    if info.details.get("no_http_answer"):
        return f"{info.url} gave no HTTP answer: {info.details['no_http_answer']}"
    if info.details.get("redirected"):
        return f"{info.url} redirected its info endpoints: {info.details['redirected']}"
    if (refused := credentials_refused(info)) is not None:
        return refused
    return f"{info.url} answers HTTP but is neither SGLang nor vLLM as far as its info endpoints say: {hint}"


AUTH_HINT = "set TOKVIEW_API_KEY to the server's --api-key (or give the URL's user:password)"


LIMIT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_len")


def context_limit(*answers: object) -> int | None:
    """The server's context length in tokens, from the first answer that reports one.

    vLLM puts `max_model_len` on each `/v1/models` entry and on `/tokenize`; SGLang reports it on
    `/v1/models` and `/tokenize` too, and as `context_length` in `/get_server_info` (and some builds'
    `/get_model_info`). A missing, null or non-positive value means "not reported", never "0".
    """
    for answer in answers:
        items = [answer]
        if isinstance(answer, dict) and isinstance(answer.get("data"), list):
            items = answer["data"][:1]
        for item in items:
            if not isinstance(item, dict):
                continue
            for key in LIMIT_KEYS:
                value = item.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def is_simulator(*answers: object) -> bool:
    """The tokview simulator says so in /get_model_info and /v1/models."""
    for answer in answers:
        data = answer.get("data") if isinstance(answer, dict) else None
        items = [answer] + (data if isinstance(data, list) else [])  # a garbage "data" is no model list
        for item in items:
            if isinstance(item, dict) and (item.get("simulator") or "tokview" in str(item.get("owned_by", ""))):
                return True
    return False


async def detect(
    client: ServerClient,
    policy: RetryPolicy,
    profile: ModelProfile | None = None,
    prompt_ids: list[int] | None = None,
    *,
    endpoints: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> ServerInfo:
    """Probe one server. Raises ServerUnreachable if it does not answer HTTP at all.

    `endpoints=False` stops after the info endpoints: no 1-token generations, so a server known only by its raw
    probe stays of kind "unknown". `template_kwargs`: what the 1-token requests render with, when not the
    profile's with thinking on (a resume probing before its profile is loaded: `ServerPool.adopt`)."""
    info = ServerInfo(url=client.url)
    (model_info, server_info, version, models), whys = await _info_answers(client, policy)
    info.details = {
        "get_model_info": model_info,
        "get_server_info": server_info,
        "version": version,
        "v1_models": models,
    }
    if all(why is not None and why.startswith(CONNECTION_LOST) for why in whys):
        info.details["no_http_answer"] = whys[0]  # not one HTTP answer, not even an error status
    redirect = next((why for why in whys if why is not None and any(r in why for r in REDIRECTED)), None)
    if redirect is not None:  # the info endpoints answered a redirect tokview does not follow: where it points
        info.details["redirected"] = redirect
    refused = next((why for why in whys if why is not None and why.startswith(AUTH_REFUSED)), None)
    # vLLM's --api-key guards its OpenAI routes and leaves /version open: a vLLM that answers nothing else refused it
    models_refused = whys[-1] is not None and whys[-1].startswith(AUTH_REFUSED) and model_info is None
    if refused is not None and (models_refused or all(a is None for a in (model_info, server_info, version, models))):
        # a server started with --api-key: no info endpoint answers without it (SGLang), or its OpenAI routes, which
        # every generation goes to, refuse it (vLLM answers /version to anyone)
        info.details["auth_refused"] = refused
    if isinstance(model_info, dict) and ("model_path" in model_info or "is_generation" in model_info):
        info.kind, info.kind_said = "sglang", True
    elif isinstance(version, dict) and "version" in version:
        info.kind, info.kind_said = "vllm", True
    # the version and model name go into the run record and every sample id: a lone surrogate in them
    # (a JSON "\ud800") made the run unwritable, so they are kept storable (written as its escape)
    for src in (version, server_info):
        if isinstance(src, dict) and src.get("version") and info.version is None:
            info.version = storable(str(src["version"]))
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        model_id = data[0].get("id")
        info.model = storable(model_id) if isinstance(model_id, str) else None
    info.max_model_len = context_limit(models, model_info, server_info)
    info.details["max_model_len"] = info.max_model_len
    if info.model is None and isinstance(model_info, dict) and isinstance(model_info.get("model_path"), str):
        info.model = storable(model_info["model_path"])
    info.features["simulator"] = is_simulator(model_info, models)
    if endpoints:
        await probe_endpoints(client, policy, info, profile, prompt_ids, template_kwargs)
    return info


INFO_PATHS = ("/get_model_info", "/get_server_info", "/version", "/v1/models")
"""The info endpoints `detect` reads, in its order: SGLang's two, vLLM's `/version`, both servers' `/v1/models`."""


async def _info_answers(client: ServerClient, policy: RetryPolicy) -> tuple[list[Any], list[str | None]]:
    """The info endpoints' answers (None where one failed) and why each failed, asked at once: one after another
    they were four round trips at every start. A dead server raises ServerUnreachable once every ask has ended
    (none is left running, and no second error goes unread)."""
    asked = await asyncio.gather(
        *(ask(policy, partial(client.get_json, path)) for path in INFO_PATHS), return_exceptions=True
    )
    answers: list[Any] = []
    whys: list[str | None] = []
    for answer in asked:
        if isinstance(answer, BaseException):
            raise answer
        answers.append(answer[0])
        whys.append(answer[1])
    return answers, whys


def probe_template_kwargs(profile: ModelProfile | None, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The chat_template_kwargs a probe renders with: `given`, else the profile's with thinking on, else none."""
    if given is not None:
        return dict(given)
    return profile.template_kwargs(True) if profile is not None else {}


async def probe_endpoints(
    client: ServerClient,
    policy: RetryPolicy,
    info: ServerInfo,
    profile: ModelProfile | None,
    prompt_ids: list[int] | None,
    template_kwargs: dict[str, Any] | None = None,
) -> None:
    """1-token requests: which id fields come back on which endpoint, and the reasoning field name.

    Each endpoint family a server of this kind may have probes itself (`Backend.probe`): the chat
    endpoint first (one request, whichever server answers it), then /tokenize, then the raw paths with
    the prompt ids those named. A server whose info endpoints said nothing is known by its raw probe.
    """
    kwargs = probe_template_kwargs(profile, template_kwargs)
    f = info.features
    probe = Probe(client, lambda fn: ask(policy, fn), info, kwargs)
    candidates = for_kind(info.kind)
    probed: set[str] = set()
    for backend in candidates:
        if not backend.exact_ids and backend.path not in probed:  # SGLang's and vLLM's chat share one probe
            probed.add(backend.path)
            await backend.probe(probe)
    prompt_ids = prompt_ids or probe.prompt_ids
    tok_body = {"messages": PROBE_MESSAGES, "add_generation_prompt": True, "chat_template_kwargs": kwargs}
    if info.model:
        tok_body["model"] = info.model
    tokens, _ = await ask(policy, lambda: client.post_json("/tokenize", tok_body))
    served = int_list(tokens.get("tokens")) if isinstance(tokens, dict) else None
    f["tokenize_messages"] = served is not None
    if served is not None:
        info.details["tokenize_prompt_ids"] = served
        if info.max_model_len is None:
            info.max_model_len = context_limit(tokens)
        prompt_ids = prompt_ids or served
    probe.prompt_ids = prompt_ids
    for backend in candidates:
        if backend.exact_ids:
            await backend.probe(probe)
    if info.kind == "unknown":
        info.kind = next((b.server for b in candidates if b.exact_ids and b.recognises(f)), "unknown")


async def health(client: ServerClient) -> bool:
    """A cheap liveness check for re-probing an evicted server: any HTTP answer below 500."""
    for path in ("/health", "/v1/models"):
        try:
            response = await client.http.get(path)
        except Exception:  # any transport failure means "not back yet"
            return False
        if response.status_code < 500 and response.status_code != 404:
            return True
    return False


async def unanswered(url: str, timeout: float = 5.0) -> tuple[str, str] | None:
    """(URL, why) when nothing answers HTTP at `url` (refused, timed out, not HTTP); None when it
    answers at all, whatever the status: that is the probe's business."""
    import httpx

    client = ServerClient(url, timeout=timeout, concurrency=1, connect_timeout=timeout)
    try:
        await client.http.get("/health")
        return None
    except httpx.TransportError as exc:
        return client.url, client.secrets.scrub(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    finally:
        await client.aclose()
