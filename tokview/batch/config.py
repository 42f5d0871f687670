"""What a batch run is asked to do, how far it has got, and how it ended.

Shared by `tokview batch` and the UI's generate panel (contract 4), so both count the same way:
`input` = sample slots planned (prompts × generation points × samples per prompt) + bad rows, and a
finished run satisfies `ok + failed + skipped == input` (an interrupted one adds `abandoned`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.core.record import settings_key
from tokview.errors import ExitCode
from tokview.untrusted_text import clipped, printable_line

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.servers import ServerPool


TOKENIZER_QUESTION = "is --tokenizer the served model's? (`tokview doctor --server URL --tokenizer DIR` compares them)"
"""The summary's question when its samples or failures point at another vocabulary (the app words it its way)."""
_RAW_REFUSAL = re.compile(r"(?i)HTTP (?:400|422) from POST (?:/v1/completions|/generate)\b.*(?:\btoken ids?\b|vocab)")
"""A failure of a request whose prompt ids the server refused as they are, in its words (vLLM: "Token id … is out of
vocabulary"; tokview's simulator: "… list of token ids in [0, 151669)"): not a refused logprob count, an unknown field
or a prompt past the context (`BatchSummary._every_raw_prompt_refused`)."""
OTHER_VOCABULARY = "the server's answers read as other text"
"""How a run stopped by `vocabulary_guard` begins its reason: the same command would stop again, so no resume is
offered."""


@dataclass
class BatchConfig:
    servers: list[str]
    prompts_path: Path | None = None
    tokenizer_dir: Path | None = None
    """None: the Kimi-layout tokenizer."""
    trust_remote_code: bool = False
    profile: str | None = None
    """A profile name or .toml; None: detected from the tokenizer."""
    backend: str = "auto"
    mode: str = "raw"
    concurrency: int = 8
    max_new_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    thinking: bool | None = True
    samples_per_prompt: int = 1
    limit: int | None = None
    run: str | None = None
    """Run name; None: `batch-<settings hash>`, so re-running the same command resumes the same run."""
    on_bad_row: str = "skip"
    timeout: float = 60.0
    retries: int = 3
    tokenizer: Any = None
    """An already loaded TokenizerAdapter (the UI has one); wins over tokenizer_dir."""
    model_profile: Any = None
    """An already resolved ModelProfile; wins over `profile`."""
    max_consecutive_failures: int = 20
    """Stop the run (with the reason) after this many failed requests in a row; 0 never stops."""
    any_vocabulary: bool = False
    """Go on when the first answers read as other text with the run's tokenizer (`vocabulary_guard`)."""
    shard: tuple[int, int] | None = None
    """(K, N): generate only the K-th of N shards of the sample ids (`--shard K/N`)."""
    workers: int = 1
    """Processes that capture and analyse (`--workers N`); the first one also lands parts in the store."""
    ray: str | None = None
    """`auto` or a Ray address: prompt shards run as Ray tasks (`--ray`)."""
    logprobs: int | None = None
    """Capture each output token's logprob and this many top alternatives (ids); None: no logprobs."""
    history: str = "served"
    """A multi-turn row's history: `served` regenerates its turns as a chain (`batch/chains.py`), `file`
    sends each turn with the file's history (independent turns, earlier reasoning dropped)."""
    history_reasoning: str = "template"
    """What reasoning a chain's served turns carry back: `template`, `all` or `none` (`chains.HISTORY_REASONING`)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """`--chat-template-kwargs`: sent (and rendered locally) over the profile's own (thinking, gpt-oss's date and
    effort); part of the sample ids, since they change the prompt."""

    def __post_init__(self) -> None:
        # Stored in the runs table (`source`, `tokenizer_dir`) and read back by export/show/ui from
        # wherever they are run: a relative path would then name another folder, or none.
        if self.prompts_path is not None:
            given = Path(self.prompts_path).expanduser()
            # `<(…)` is /dev/fd/63, a link to "pipe:[N]": resolved, it was "not found" instead of "not a regular file"
            self.prompts_path = (
                _resolved(given) if given.is_file() or not given.exists() else Path(os.path.abspath(given))
            )
        if self.tokenizer_dir is not None:
            self.tokenizer_dir = _resolved(Path(self.tokenizer_dir).expanduser())

    def generation_settings(self) -> dict[str, Any]:
        """The sampling settings sent with every request."""
        settings: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "thinking": self.thinking,
            "mode": self.mode,
        }
        if self.logprobs is not None:  # only when asked: earlier runs' sample ids stay the same
            settings["logprobs"] = self.logprobs
        if self.chat_template_kwargs:  # only when given, for the same reason
            settings["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        return settings

    def sample_settings(self, identity: dict[str, Any] | None = None) -> dict[str, Any]:
        """What makes a sample what it is, hashed into every sample id and the default run id.

        `identity` is the served model name (known after probing), the tokenizer fingerprint and
        the profile name: a second model's run into the same store must not "resume" the first's
        samples. The server URL is deliberately left out: the same model on another port makes
        the same data, so a run moved to another box resumes.
        """
        return {**self.generation_settings(), **(identity or {})}

    def tokenizer_and_profile(self, *, sliced: bool = True) -> tuple[TokenizerAdapter, ModelProfile]:
        """The tokenizer and profile this run uses: the loaded ones it was given, else the ones `preload.start`
        is loading, else loaded from its flags now (`sliced`: see `load_tokenizer_and_profile`)."""
        from tokview.batch import preload

        started = preload.take(self)
        if started is not None:
            return started.result()
        return self.load_tokenizer_and_profile(sliced=sliced)

    def server_pool(
        self,
        tokenizer: TokenizerAdapter | None = None,
        profile: ModelProfile | None = None,
        *,
        names_only: bool = False,
        probe_kwargs: dict[str, Any] | None = None,
    ) -> ServerPool:
        """The pool this run's requests go through: every process of a run (the parent, `--workers`
        children, Ray tasks, the resume shortcut's probe) builds the same one from the same flags.
        `names_only`: its probe learns the servers' model names and sends no generation; `probe_kwargs`: what
        its probe renders with before the profile is known (`ServerPool`)."""
        from tokview.servers import ServerPool

        return ServerPool(
            self.servers,
            backend=self.backend,
            tokenizer=tokenizer,
            profile=profile,
            concurrency=self.concurrency,
            timeout=self.timeout,
            retries=self.retries,
            names_only=names_only,
            probe_kwargs=probe_kwargs,
        )

    def load_tokenizer_and_profile(self, *, sliced: bool = True) -> tuple[TokenizerAdapter, ModelProfile]:
        """`sliced`: a tokenizer.json is answered from vocabulary slices until the run asks for the whole one
        (`core.vocab_slices`; `runner.SLICED_SAMPLES`); a `--workers` child or a Ray shard, which has much to
        encode, loads it whole at once."""
        from tokview.core.resolve import load_tokenizer_and_profile

        return load_tokenizer_and_profile(
            self.tokenizer_dir,
            self.profile,
            trust_remote_code=self.trust_remote_code,
            tokenizer=self.tokenizer,
            model_profile=self.model_profile,
            sliced=sliced,
        )

    def run_id(self, identity: dict[str, Any] | None = None) -> str:
        """`--run`, else one named by what makes the run's samples: their settings, and how a multi-turn row's history
        is made when not the default (`--history file` and `--history served` on one file were one run: their turns
        mixed in `stats`, and `--trajectory` joined them as branches of one conversation); `--history-reasoning` only
        where it makes anything (a served chain). The default adds nothing, so a chained run from before resumes under
        its id. A single-turn row's sample is the same whatever the history (its sample id too): a run made otherwise
        finds it stored, as a run under another `--run` name does."""
        if self.run:
            return self.run
        return f"batch-{settings_key(self.run_settings(identity))}"

    def run_settings(self, identity: dict[str, Any] | None = None) -> dict[str, Any]:
        """The sample settings and how a multi-turn row's history is made when not the default: what names a run by
        default (`run_id`). Its record holds the history whatever it is (`record_settings`)."""
        history = {"history": self.history} if self.history != "served" else {}
        if self.history == "served" and self.history_reasoning != "template":
            history["history_reasoning"] = self.history_reasoning
        return {**self.sample_settings(identity), **history}

    def record_settings(self, identity: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a run's record holds of how its samples were made: the sample settings and the history, always (a
        record without it was made by a tokview that did not record it), so a run resumed under its name with
        another history is refused as one with other sample settings is (`run_record.check_run_provenance`)."""
        history = {"history": self.history, "history_reasoning": self.history_reasoning}
        return {**self.sample_settings(identity), **history}

    def validate(self) -> None:
        """Range checks, one line each: a negative retry count or limit is a usage error, never a crash
        deep in the retry loop or a silently empty (or silently truncated) run."""
        from tokview.batch.inputs import InputError

        for flag, value in (("--temperature", self.temperature), ("--top-p", self.top_p), ("--timeout", self.timeout)):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                # `inf` would reach the manifest as `Infinity`, which strict JSON parsers refuse
                raise InputError(f"{flag} must be a finite number, got {value!r}")
        checks = [
            (self.concurrency >= 1, "--concurrency must be at least 1"),
            (
                1 <= self.samples_per_prompt <= MAX_SAMPLES_PER_PROMPT,
                f"--samples-per-prompt must be between 1 and {MAX_SAMPLES_PER_PROMPT:,}",
            ),
            (self.max_new_tokens >= 1, "--max-new-tokens must be at least 1"),
            (self.limit is None or self.limit >= 1, "--limit must be at least 1"),
            (self.retries >= 0, "--retries must be 0 or more"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "--logprobs must be between 0 and 20"),
            (self.timeout > 0, "--timeout must be more than 0 seconds"),
            (0.0 < self.top_p <= 1.0, "--top-p must be above 0 and at most 1 (vLLM and SGLang refuse 0)"),
            (self.temperature >= 0.0, "--temperature must be 0 or more"),
            (self.mode in ("raw", "chat", "dual"), f"unknown mode {self.mode!r} (choose raw, chat or dual)"),
            (self.on_bad_row in ("skip", "stop"), "--on-bad-row must be skip or stop"),
            (bool(self.servers), "give at least one --server"),
            (self.max_consecutive_failures >= 0, "--max-consecutive-failures must be 0 or more"),
            (self.workers >= 1, "--workers must be at least 1"),
            (self.ray is None or bool(self.ray.strip()), "--ray needs a Ray address or auto, not an empty value"),
            (self.shard is None or 1 <= self.shard[0] <= self.shard[1], "--shard K/N needs 1 <= K <= N"),
            (self.history in ("served", "file"), f"--history must be served or file, not {self.history!r}"),
            (
                self.history_reasoning in ("template", "all", "none"),
                f"--history-reasoning must be template, all or none, not {self.history_reasoning!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(message)
        self._check_combinations()
        if self.workers > 1:  # a bad TOKVIEW_MIN_PROMPTS_PER_WORKER fails here, before the store is created
            min_prompts_per_worker()
        from tokview.batch.prompt_size import max_prompt_bytes

        max_prompt_bytes()  # a bad TOKVIEW_MAX_PROMPT_MB too
        if self.ray is not None and importlib.util.find_spec("ray") is None:  # not after the store and the run exist
            raise InputError(
                "--ray needs Ray: install tokview's ray extra (pip install -e '.[ray]' in tokview's folder)"
            )

    def _check_combinations(self) -> None:
        """Flags that cannot go together, refused before anything is written: each failed every row on its own (exit
        3, a failure stored a row), or ran another mode than the run is stored as."""
        from tokview.batch.inputs import InputError
        from tokview.core.profiles import RESERVED_WHY, reserved_template_kwargs
        from tokview.servers.capture import CHAT_LOGPROBS_BY_TEXT, KWARGS_TOOLS_ON_CHAT
        from tokview.servers.registry import CHOICES

        if taken := reserved_template_kwargs(self.chat_template_kwargs):
            raise InputError(f"--chat-template-kwargs may not set {taken}: {RESERVED_WHY}")
        if self.history == "file" and self.history_reasoning != "template":  # it was taken and did nothing
            raise InputError(
                f"--history-reasoning {self.history_reasoning} applies to --history served (a chain's own turns); "
                "--history file sends every earlier turn without its reasoning"
            )
        choice = CHOICES.get(self.backend)  # None for auto: the server's kind is known once it is probed
        if choice is not None and choice.chat_only and self.mode != "chat":
            raise InputError(
                f"--backend {choice.name} is {choice.chat.server_name}'s chat endpoint alone: it runs --mode chat, "
                f"not {self.mode} (the samples were stored under a run of that mode)"
            )
        tools = isinstance(self.chat_template_kwargs, dict) and "tools" in self.chat_template_kwargs
        if tools and choice is not None and not choice.chat.kwargs_take_tools and self.mode != "raw":
            raise InputError(KWARGS_TOOLS_ON_CHAT.format(mode=self.mode, server=choice.chat.server_name))
        if choice is not None and self.logprobs is not None and self.mode == "chat" and not choice.chat.logprob_ids:
            raise InputError(CHAT_LOGPROBS_BY_TEXT.format(server=choice.chat.server_name))


MAX_SAMPLES_PER_PROMPT = 10_000
"""Every sample slot of a prompt is planned before the first request (its sample id, resume): 10^8 of them kept the
app's planning thread busy past any cancel, and the app could not exit. No drafter set needs more answers a prompt."""

BATCH_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(BatchConfig) if f.default is not MISSING}
"""`tokview batch`'s defaults, read by its flags (and their help) from the dataclass above: one place."""

PANEL_DEFAULTS: dict[str, Any] = {
    **BATCH_DEFAULTS,
    "temperature": 0.6,
    "max_new_tokens": 256,
    "concurrency": 4,
    "timeout": 30.0,
    "retries": 2,
}
"""The app's generate panel: short interactive runs (a few samples to look at while a person waits), so shorter
outputs, fewer requests in flight, a shorter timeout and fewer retries than a headless data-set run."""


@dataclass
class BatchProgress:
    total: int
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    flagged: int = 0
    """Stored samples with at least one error finding."""
    truncated: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0
    chain_stopped: int = 0
    """Turns not generated because their chain stopped before them: settled, not pending."""
    retried: int = 0
    """Requests sent again after a retryable failure (`ServerPool.retried`; a `--workers` child's as of the last part
    it wrote), and the last one's reason."""
    last_retry: str | None = None

    @property
    def done(self) -> int:
        return self.ok + self.failed + self.skipped + self.chain_stopped

    @property
    def req_per_s(self) -> float:
        return (self.ok + self.failed) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        remaining = self.total - self.done
        rate = self.req_per_s
        return remaining / rate if rate > 0 else None


FLAGGED_CODES_SHOWN = 4
"""Error finding codes the summary names beside the flagged count (`tokview stats` lists them all)."""


@dataclass
class BatchSummary:
    run_id: str
    input: int
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    resumed: int = 0
    """Skipped because the sample was already in the store."""
    resumed_from: str | None = None
    """Whose answers the samples already stored are, when not this server kind's in this run (`run_record.
    stored_elsewhere`): a sample is its prompt, settings and index, whichever server answered it, so `--run sg` or
    the same command against an SGLang server stored nothing into a vLLM store and said only "already stored"."""
    duplicates: int = 0
    """Skipped because an earlier input row had the same prompt id."""
    bad_rows: list[str] = field(default_factory=list)
    flagged: int = 0
    truncated: int = 0
    abandoned: int = 0
    interrupted: bool = False
    output_tokens: int = 0
    elapsed_s: float = 0.0
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    servers: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None
    """Why the run stopped taking work early (a full disk, too many failures in a row), if it did."""
    notes: list[str] = field(default_factory=list)
    """What happened that did not cost the run a sample (a `--workers` child that died, its work done
    by the others)."""
    chain_stopped: int = 0
    """Turns of multi-turn rows not generated because their chain stopped before them (`batch/chains.py`),
    in this run or an earlier one; `chain_stops` says why, per reason."""
    chain_stops: dict[str, int] = field(default_factory=dict)
    chains_stopped: dict[str, int] = field(default_factory=dict)
    """How many chains stopped for each reason of `chain_stops` (none for a stop an earlier run made)."""
    flagged_by_code: dict[str, int] = field(default_factory=dict)
    """Flagged samples per error finding code (a sample with two codes counts under each)."""

    @property
    def balanced(self) -> bool:
        return self.ok + self.failed + self.skipped + self.chain_stopped + self.abandoned == self.input

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        if self.stopped:
            return ExitCode.USAGE
        if self.failed:
            return ExitCode.FAILURES
        return ExitCode.BAD_ROWS if self.bad_rows else ExitCode.OK

    @property
    def failures_by_class(self) -> dict[str, int]:
        """`failures_by_reason` grouped by what went wrong, not by each URL, id or server message."""
        return group_reasons(self.failures_by_reason)

    def _flagged_codes(self) -> str:
        """` (code n, …)`: the most frequent error finding codes of the flagged samples, if any."""
        codes = sorted(self.flagged_by_code.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = ", ".join(f"{code} {n}" for code, n in codes[:FLAGGED_CODES_SHOWN])
        more = f", {len(codes) - FLAGGED_CODES_SHOWN} more codes" if len(codes) > FLAGGED_CODES_SHOWN else ""
        return f" ({shown}{more})" if codes else ""

    def _every_raw_prompt_refused(self) -> bool:
        """Nothing stored and every request refused on a path that takes the ids tokview rendered (raw mode): a
        tokenizer of a bigger vocabulary than the server's sends ids it refuses (`[0, 151669)`), and the run said
        only the server's words, 6 of 6 failed (or, past 20, too many failures in a row)."""
        reasons = self.failures_by_reason
        return not self.ok and bool(reasons) and all(_RAW_REFUSAL.match(reason) for reason in reasons)

    def failure_examples(self) -> dict[str, str]:
        """One full reason per class, so the grouping never hides the server's own words."""
        return reason_examples(self.failures_by_reason)

    def render(self) -> str:
        rate = self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0
        lines = [
            f"run {printable_line(self.run_id)}: ok {self.ok} + failed {self.failed} + skipped {self.skipped}"
            + (f" + after a chain stop {self.chain_stopped}" if self.chain_stopped else "")
            + (f" + abandoned {self.abandoned}" if self.abandoned else "")
            + f" = {self.ok + self.failed + self.skipped + self.chain_stopped + self.abandoned} of input {self.input} "
            + ("(balanced)" if self.balanced else "(DOES NOT BALANCE)"),
            f"  skipped: {self.resumed} already stored, {self.duplicates} for repeated prompt ids, "
            f"{len(self.bad_rows)} bad rows",
            f"  flagged (error findings) {self.flagged}{self._flagged_codes()}, truncated {self.truncated}; "
            f"{self.output_tokens} output tokens in {self.elapsed_s:.1f}s ({rate:.2f} samples/s)",
        ]
        if self.resumed and self.resumed_from:
            lines.append(
                f"  note: the {self.resumed} already stored are {self.resumed_from}: a sample is its prompt, settings "
                "and index, whichever run or server answered it (another --db, or other settings, stores new answers)"
            )
        if self.ok and self.flagged == self.ok:  # exit 0, and every export after it refused "no samples match"
            lines.append(
                f"  note: all {self.ok} sample(s) stored have an error finding: an export's default selection (valid) "
                "takes none of them (the codes above say why; `tokview show ID` explains one)"
            )
        if self.flagged_by_code.get("unknown_token_id"):
            lines.append(
                f"  note: {self.flagged_by_code['unknown_token_id']} sample(s) hold ids the tokenizer does not have: "
                f"{TOKENIZER_QUESTION}"
            )
        if self._every_raw_prompt_refused():
            lines.append(
                f"  note: the server refused every request's prompt ids, which the local tokenizer rendered: "
                f"{TOKENIZER_QUESTION}"
            )
        examples = self.failure_examples()
        for cls, n in list(self.failures_by_class.items())[:10]:  # reasons quote servers: escapes shown, not run
            example = printable_line(clipped(examples[cls], 200))
            shown = printable_line(cls)
            lines.append(f"  failed x{n}: {shown}" + (f" (e.g. {example})" if examples[cls] != cls else ""))
        for why, n in sorted(self.chain_stops.items(), key=lambda kv: -kv[1])[:10]:
            chains = self.chains_stopped.get(why)
            stopped = "chains stopped" if chains is None else f"{chains} chain{'s' * (chains != 1)} stopped"
            said = f"{stopped}, {n} later turn{'s' * (n != 1)} not generated"
            lines.append(f"  {said}: {printable_line(clipped(why, 200))}")
        lines += [f"  note: {printable_line(note)}" for note in self.notes]
        if self.stopped:
            if self.stopped.startswith(OTHER_VOCABULARY):  # the same command would stop again
                kept = (
                    f"the answers so far are kept in run {printable_line(self.run_id)}, each read with that tokenizer"
                )
            else:
                kept = "committed samples are kept, re-run the same command to resume"
            lines.append(f"  stopped: {printable_line(self.stopped)}; {kept}")
        if self.interrupted:
            lines.append("  interrupted: committed samples are kept; re-run the same command to resume")
        return "\n".join(lines)


_CLASS_PREFIXES = (
    ("over_max_length", "over_max_length"),
    ("cannot connect to", "cannot connect"),
    ("timed out after", "timed out"),
    ("connection lost during", "connection lost"),
    ("no healthy server", "no healthy server"),
)


FLAGGED_PREFIX = "\x00flagged: "
"""How a writer's `reasons` counts its flagged samples by error finding code: they travel with the failure reasons
(a `--workers` child's and a Ray task's counts too) and are read apart by the runner."""


def split_flagged(reasons: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(the other reasons, flagged samples by error finding code)."""
    rest = {r: n for r, n in reasons.items() if not r.startswith(FLAGGED_PREFIX)}
    flagged = {r[len(FLAGGED_PREFIX) :]: n for r, n in reasons.items() if r.startswith(FLAGGED_PREFIX)}
    return rest, flagged


def group_reasons(by_reason: dict[str, int]) -> dict[str, int]:
    """{reason: count} as {reason class: count}, most frequent first (batch summary, `tokview stats`)."""
    grouped: Counter[str] = Counter()
    for reason, n in by_reason.items():
        grouped[reason_class(reason)] += n
    return dict(grouped.most_common())


def reason_examples(by_reason: dict[str, int]) -> dict[str, str]:
    """The most frequent full reason of each class."""
    examples: dict[str, str] = {}
    for reason, _ in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        examples.setdefault(reason_class(reason), reason)
    return examples


def reason_class(reason: str) -> str:
    """The kind of a failure reason: `HTTP 500 from POST /generate`, `timed out`, `over_max_length`,
    `unexpected error: TypeError`, … (the server's message, URLs, ids and attempt counts dropped)."""
    text = re.sub(r"\s*\(gave up after \d+ attempts?\)$", "", reason.strip())
    for prefix, cls in _CLASS_PREFIXES:
        if text.startswith(prefix):
            return cls
    if text.startswith("unexpected error: "):
        return "unexpected error: " + text[len("unexpected error: ") :].split(":", 1)[0].strip()
    head = text.split(": ", 1)[0]
    head = re.sub(r"\s*\(.*$", "", head)
    head = re.sub(r"\bafter \d+ (chunk|event)s?\b", r"after N \1s", head)  # a proxy's stream, cut at any point
    return head[:100] or "unknown"


MIN_PROMPTS_PER_WORKER = 250
"""Work items (prompts x samples) each process needs before `--workers` spawns another: a child costs
~0.5 s of CPU to start (imports, a tokenizer) on cores the parent needs. Measured on 2 idle cores
(`benchmarks/bench_goals.py`, 2,000-token answers), a second process lost at 300 prompts (1.17 s vs
0.94 s with one) and won at 600 (1.40 vs 1.58 s): the lines cross near 470. On a loaded box (load 5-7)
it still lost at 400 and 500 and broke even at 600. At 32 a worker it was spawned from 64 prompts."""

MIN_PROMPTS_ENV = "TOKVIEW_MIN_PROMPTS_PER_WORKER"
"""Overrides `MIN_PROMPTS_PER_WORKER` (another machine, or the tests, which want a child on ~100 prompts)."""


def min_prompts_per_worker() -> int:
    """The threshold in force: `MIN_PROMPTS_ENV` if set (and not empty), else the measured default."""
    from tokview.batch.inputs import InputError

    value = os.environ.get(MIN_PROMPTS_ENV, "").strip()
    if not value:
        return MIN_PROMPTS_PER_WORKER
    if not value.isdecimal() or int(value) < 1:
        raise InputError(f"{MIN_PROMPTS_ENV} must be a whole number of at least 1, not {value!r}")
    return int(value)


def _resolved(path: Path) -> Path:
    """`path` with its links followed; as given (made absolute) where they loop, so the reader that opens it says what
    is wrong in one line (`resolve()` raised RuntimeError: an internal error, exit 70)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(path))
