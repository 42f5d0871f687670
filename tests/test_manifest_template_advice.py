"""The manifest tells the reader to register a SpecForge template only when the export wrote one."""

from __future__ import annotations

import pytest

from tokview.export import export


@pytest.mark.parametrize("fmt", ["specforge", "speculators", "sharegpt"])
def test_the_kimi_template_warning_names_what_this_export_offers(sample_store, kimi_tok, kimi_profile, tmp_path, fmt):
    result = export(sample_store, fmt, tmp_path / "out.jsonl", select="all", tokenizer=kimi_tok, profile=kimi_profile)
    warnings = result.manifest["warnings"]
    kimi = [w for w in warnings if "kimi-k2-thinking" in w]
    assert len(kimi) == 1
    written = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith("specforge_template.json"))
    if fmt == "specforge":
        assert written
        assert f"Register {written[0]}" in kimi[0]
    else:
        assert not written
        assert "specforge_template.json written beside" not in kimi[0]
    if fmt == "speculators":
        assert "data.prompts_path" in kimi[0]
        assert "no template" in kimi[0]
    if fmt == "sharegpt":
        assert "export --format specforge" in kimi[0]
