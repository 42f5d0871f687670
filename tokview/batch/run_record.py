"""What a batch records about its run before its first sample lands, wherever the store is opened.

A run's provenance row (`Store.put_run`) and the two checks before it (the run name is not another run's; the
stored runs of the same model, vocabulary and profile recorded the same special ids) are one `RunRecord`: plain
data, so a new store's landing child (`landing_process.py`) records it in its own process exactly as the batch's
process records it in a store it opened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.store import Store


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    settings: dict[str, Any]
    """The sample settings (what sample ids hold): a stored run of the same name must have made them."""
    special: dict[str, str]
    """`identity.special_tokens_record` of the run's tokenizer, stored beside the settings."""
    tokenizer_name: str
    profile: str
    tokenizer_dir: str | None
    tokenizer_hash: str
    template_hash: str | None
    server_info: list[Any]
    """The servers' info, credentials scrubbed."""
    source: str | None
    profile_def: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        return cls(**data)

    def record(self, store: Store, piece: Callable[[int], str] | None = None) -> None:
        """Check the run against the store, then record it. InputError when a check refuses it (nothing written);
        `piece` names the special ids' text in that error where a tokenizer is at hand."""
        from tokview.batch.identity import refuse_other_special_tokens

        check_run_provenance(store, self.run_id, self.settings, self.template_hash)
        refuse_other_special_tokens(store, self.settings, self.special, self.tokenizer_name, piece)
        store.put_run(
            self.run_id,
            settings={**self.settings, **self.special},  # beside the sample settings, never in sample ids
            profile=self.profile,
            tokenizer_dir=self.tokenizer_dir,
            tokenizer_hash=self.tokenizer_hash,
            template_hash=self.template_hash,
            server_info=self.server_info,
            source=self.source,
            profile_def=self.profile_def,
        )


def stored_elsewhere(store: Store, run_id: str, servers: list[dict[str, Any]]) -> str | None:
    """Whose the samples a plan found already stored are, when they are not this run's answers from a server of this
    kind: "other runs' samples" for a run the store does not hold yet, "answers of vllm (run R)" for a run recorded
    against other server kinds; None when the run is this one's."""
    run = store.run(run_id)
    if run is None:
        return "other runs' samples"
    recorded = {s.get("kind") for s in run.get("server_info") or () if isinstance(s, dict)} - {None}
    kinds = {s.get("kind") for s in servers if isinstance(s, dict)} - {None}
    if recorded and kinds and recorded.isdisjoint(kinds):
        return f"answers of {', '.join(sorted(map(str, recorded)))} (run {run_id}), not of this {', '.join(sorted(map(str, kinds)))} server"
    return None


def check_run_provenance(store: Store, run_id: str, settings: dict[str, Any], template_hash: str | None = None) -> None:
    """Refuse to reuse a run name for other settings, another model or tokenizer: its provenance would be lost.

    A raw or dual run renders its prompts with the tokenizer folder's chat template, which sample ids do not hold
    (an edited tokenizer_config.json must not turn a resume into a second generation of every prompt): a run resumed
    with another template went on with prompts rendered otherwise, its stored ones skipped as done, and the run's
    record then named only the new template."""
    from tokview.batch.inputs import InputError
    from tokview.core.record import changed_settings

    stored = store.run(run_id) or {}
    old = stored.get("settings") or {}
    changed = changed_settings(old, settings) if stored else []  # a new run: nothing to differ from
    if changed:
        was_made = ", ".join(f"{k}={old.get(k)!r}" for k in changed)
        now = ", ".join(f"{k}={settings.get(k)!r}" for k in changed)
        raise InputError(
            f"run {run_id} was made with other {', '.join(changed)} ({was_made}; now {now}): choose another --run name"
        )
    was = stored.get("template_hash")
    if settings.get("mode") in ("raw", "dual") and was and template_hash and was != template_hash:
        raise InputError(
            f"run {run_id} rendered its prompts with another chat template (hash {was}; this tokenizer folder's is "
            f"{template_hash}; an upgrade of tokview changes its own folder's): its stored samples would count as "
            "done and the rest be rendered with this one; make the new prompts in another store (--db), or put that "
            "template back"
        )
