"""Every code block of the docs runs, and prints what the page shows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from doc_examples import Block, ExampleError, MissingData, blocks, check_output, commands, run_page
from docbuild import DOCS, BuiltDocs

PAGES = sorted(
    str(path.relative_to(DOCS).with_suffix(""))
    for path in DOCS.rglob("*.rst")
    if not path.relative_to(DOCS).parts[0].startswith("_")
)


@pytest.mark.parametrize("docname", PAGES)
def test_page_examples_run_as_shown(built_docs: BuiltDocs, docname: str, tmp_path: Path):
    page_blocks = blocks(built_docs.doctree(docname), docname)
    try:
        run_page(page_blocks, tmp_path)
    except MissingData as exc:
        skip_or_fail(str(exc))


def skip_or_fail(reason: str) -> None:
    """Skip for missing shared data; fail instead under CI, as every data test does."""
    if os.environ.get("KVCORE_REQUIRE_DATA") == "1":
        pytest.fail(f"{reason} (KVCORE_REQUIRE_DATA=1: the shared data must be present)")
    pytest.skip(reason)


def test_the_integration_guide_loop_is_one_of_the_blocks_run(built_docs: BuiltDocs):
    # test_page_examples_run_as_shown[how-to/integrate-an-engine] runs them.
    assert "how-to/integrate-an-engine" in PAGES
    page_blocks = blocks(built_docs.doctree("how-to/integrate-an-engine"), "guide")
    python = [b.text for b in page_blocks if b.language == "python"]
    loop = [text for text in python if "def step(" in text]
    assert len(loop) == 1, "the scheduler loop is not a Python block of the guide"
    for call in ("get_computed_blocks(", "allocate_slots(", "free(", "block_table("):
        assert any(call in text for text in python), call
    # The model runner addresses the cache through kvcore.paging, not by hand.
    for call in ("paging.block_table_tensor(", "paging.scatter(", "paging.gather("):
        assert any(call in text for text in python), call
    for call in ("allocate_kv_cache(", "take_events(", "reset_prefix_cache("):
        assert any(call in text for text in python), call
    assert sum(b.is_output for b in page_blocks) >= 7


def block(text: str, language: str = "python", classes: tuple[str, ...] = ()) -> Block:
    return Block(
        text=text, language=language, classes=classes, where="t.rst:1", from_docstring=False
    )


def test_a_block_printing_something_else_fails(tmp_path: Path):
    page = [block("print(6 * 7)"), block("41", "text", ("output",))]
    with pytest.raises(ExampleError, match="differs"):
        run_page(page, tmp_path)
    assert run_page([block("print(6 * 7)"), block("42", "text", ("output",))], tmp_path) == 2


def test_a_block_printing_with_no_output_block_fails(tmp_path: Path):
    with pytest.raises(ExampleError, match="shows no output block"):
        run_page([block("print('hidden')")], tmp_path)


def test_a_raising_block_fails_and_blocks_share_a_namespace(tmp_path: Path):
    assert run_page([block("x = 3"), block("assert x == 3")], tmp_path) == 2
    with pytest.raises(ExampleError, match="NameError"):
        run_page([block("print(config)")], tmp_path)


def test_unknown_languages_and_commands_fail(tmp_path: Path):
    with pytest.raises(ExampleError, match="no runner"):
        run_page([block("x", "rust")], tmp_path)
    with pytest.raises(ExampleError, match="does not run 'rm'"):
        run_page([block("$ rm -rf build", "console")], tmp_path)
    with pytest.raises(ExampleError, match="unknown extra"):
        run_page([block("$ pip install -c constraints.txt -e '.[plots]'", "console")], tmp_path)


def test_console_commands_run_and_their_output_is_compared(tmp_path: Path):
    shown = (
        "$ kvcore plan gpt-oss-20b --only sliding_window,full_attention\n"
        "gpt-oss-20b: 24 cache layers (12 sliding_window, 12 full_attention)\n..."
    )
    assert run_page([block(shown, "console")], tmp_path) == 1
    with pytest.raises(ExampleError, match="differs"):
        run_page([block(shown.replace("24 cache", "25 cache"), "console")], tmp_path)


def test_commands_continue_over_backslashes():
    assert commands("$ kvcore plan \\\n    gemma-3-27b\nout 1\nout 2\n$ kvcore plugins") == [
        ("kvcore plan gemma-3-27b", "out 1\nout 2"),
        ("kvcore plugins", ""),
    ]


def test_measured_times_and_padding_are_not_compared_but_counts_are():
    check_output("decode  662,964 calls, mean   6.74 µs", "decode 662,964 calls, mean 16.1 µs", "")
    check_output("wall time    7.99 s: setup 0.07 s", "wall time 12.10 s: setup 0.10 s", "")
    with pytest.raises(ExampleError):
        check_output("decode 662,964 calls", "decode 662,965 calls", "")


def test_code_shown_as_plain_text_fails(tmp_path: Path):
    for disguised in ("$ kvcore plan x", "pip install kvcore", "import kvcore\nkvcore.plan('x')"):
        with pytest.raises(ExampleError, match="would never run"):
            run_page([block(disguised, "text")], tmp_path)
    diagram = "engine ──► KVCacheManager\n   │\n   ▼\ncoordinator"
    formula = "num_blocks = memory // bytes_per_block"
    assert run_page([block(diagram, "text"), block(formula, "text")], tmp_path) == 0


def test_setup_commands_are_checked_not_run(tmp_path: Path):
    session = (
        "$ python3 -m venv .venv\n$ source .venv/bin/activate\n"
        "$ python -m pip install -c constraints.txt -e '.[plot]'\n"
        "$ python -m build --wheel\n$ python -m pip install -c constraints.txt dist/kvcore-*.whl"
    )
    assert run_page([block(session, "console")], tmp_path) == 1
    with pytest.raises(ExampleError, match="unknown extra"):
        run_page([block("$ python -m pip install -e '.[plots]'", "console")], tmp_path)
    with pytest.raises(ExampleError, match="neither a path"):
        run_page([block("$ python -m pip install torch", "console")], tmp_path)


def test_blocks_marked_not_run_in_ci_are_not_run(tmp_path: Path):
    cuda = "$ python -m pip install torch --index-url https://download.pytorch.org/whl/cu128"
    assert run_page([block(cuda, "console", ("not-run-in-ci",))], tmp_path) == 0
    with pytest.raises(ExampleError, match="neither a path"):
        run_page([block(cuda, "console")], tmp_path)


def test_a_command_exiting_through_argparse_is_compared(tmp_path: Path):
    import kvcore

    shown = f"$ kvcore --version\nkvcore {kvcore.__version__} ({kvcore.backend()} backend)"
    assert run_page([block(shown, "console")], tmp_path) == 1


def test_missing_data_skips_but_fails_under_require_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    import doc_examples

    monkeypatch.setattr(doc_examples, "DATA", tmp_path / "nonexistent")
    page = [block("$ kvcore simulate --trace conversation_trace.jsonl", "console")]
    with pytest.raises(MissingData) as missing:
        run_page(page, tmp_path)
    monkeypatch.setenv("KVCORE_REQUIRE_DATA", "1")
    with pytest.raises(pytest.fail.Exception, match="KVCORE_REQUIRE_DATA=1"):
        skip_or_fail(str(missing.value))
    monkeypatch.delenv("KVCORE_REQUIRE_DATA")
    with pytest.raises(pytest.skip.Exception):
        skip_or_fail(str(missing.value))
