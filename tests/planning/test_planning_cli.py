"""``kvcore plan``: output, JSON, options, errors, and its reference section."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from planning_helpers import BUILTIN_PLUGINS

import kvcore
from kvcore._cli.main import build_parser, main

ONLY = ["--only", ",".join(BUILTIN_PLUGINS)]
REPO = Path(__file__).resolve().parents[2]


def test_plan_prints_groups_blocks_capacity_and_waste(capsys):
    assert main(["plan", "gemma-3-27b", *ONLY]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gemma-3-27b: 62 cache layers (52 sliding_window, 10 full_attention)")
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+  \w", line)]
    assert [row[1] for row in rows] == ["sliding_window"] * 6 + ["full_attention"]
    assert [row[2] for row in rows] == ["9", "9", "9", "9", "8", "8", "10"]
    assert rows[-1][3:] == ["5,11,17,23,…,59", "16", "128.00", "KiB", "8192", "0", "B"]
    assert "blocks:          65536 of 1.25 MiB (80.00 GiB in all)" in out
    assert "token capacity:  737080 tokens" in out
    assert "max concurrency: 5.62 requests of 131072 tokens" in out
    assert "(3.96% of the pool at max_model_len; 8 padding layer slots)" in out


def test_plan_json_matches_the_api(capsys):
    argv = ["plan", "gpt-oss-20b", "--memory", "24GB", "--max-model-len", "32768", "--json"]
    assert main([*argv, *ONLY]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = kvcore.plan(
        "gpt-oss-20b",
        memory=24 * 10**9,
        max_model_len=32768,
        registry=kvcore.load_registry(only=list(BUILTIN_PLUGINS)),
    )
    assert data == json.loads(json.dumps(expected.to_dict()))
    assert data["num_blocks"] == 24 * 10**9 // 393_216


def test_plan_options_reach_the_planner(capsys):
    argv = [
        "plan",
        "gemma-3-27b",
        "--block-size",
        "32",
        "--dtype",
        "fp8",
        "--max-num-batched-tokens",
        "2048",
        "--num-blocks",
        "20000",
        "--group-size-rule",
        "gcd",
        "--json",
        *ONLY,
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_blocks"] == 20000
    assert data["max_num_batched_tokens"] == 2048
    assert data["group_size_rule"] == "gcd"
    assert data["reference"]["padding_slots"] == 8
    assert {g["block_size"] for g in data["groups"]} == {32}
    # fp8: 16 heads x 256 x 1 byte x 32 tokens.
    assert {tuple(g["page_sizes"]) for g in data["groups"]} == {(131_072,)}


def test_plan_layout_hybrid_and_plugin_options(capsys):
    assert main(["plan", "gpt-oss-20b", "--no-hybrid", "--json", *ONLY]) == 0
    assert [g["kind"] for g in json.loads(capsys.readouterr().out)["groups"]] == ["full_attention"]
    assert main(["plan", "jamba-v0.1", "--option", "mamba.cache_mode=none", "--json", *ONLY]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["groups"][0]["pages_per_request"] == 1
    assert main(["plan", "llama-3-8b", "--layout", "block-outer", "--json", *ONLY]) == 0
    assert json.loads(capsys.readouterr().out)["layout"] == "block_outer"


def test_the_quantized_mix_shows_its_padded_pages(capsys):
    assert main(["plan", "nvfp4-hybrid-8b", "--pool", "shared", *ONLY]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nvfp4-hybrid-8b: 32 cache layers (24 sliding_window, 8 nvfp4_attention)")
    nvfp4 = next(line.split() for line in out.splitlines() if "nvfp4_attention   " in line)
    assert nvfp4[3:] == ["3,7,11,15,…,31", "16", "64.00", "KiB", "8192", "368.00", "KiB"]
    assert "(59.34% of the pool at max_model_len; 0 padding layer slots)" in out
    assert "note: pages padded to the common page size: 8 nvfp4_attention layers" in out


def test_list_models(capsys):
    assert main(["plan", "--list-models"]) == 0
    assert capsys.readouterr().out.split() == kvcore.planning.list_models()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no-such-model"], "unknown model 'no-such-model'"),
        ([], "give a MODEL"),
        (["llama-3-8b", "--memory", "512MiB", "--max-model-len", "8192"], "give at least 1.01 GiB"),
        (["llama-3-8b", "--memory", "3MiB"], "not even a 1-token request fits"),
        (["llama-3-8b", "--memory", "80G"], "ambiguous"),
        (["llama-3-8b", "--block-size", "0"], "block_size must be a positive integer"),
        (["gemma-3-27b", "--only", "full_attention"], "no selected kvcore plugin recognizes"),
        (["jamba-v0.1", "-o", "mamba.cache_mode=all"], "'mamba.cache_mode' must be one of"),
        (["jamba-v0.1", "-o", "mamba.cachemode=none"], "Did you mean 'mamba.cache_mode'?"),
        (["jamba-v0.1", "-o", "cache_mode"], "write it as PLUGIN.NAME=VALUE"),
        (
            ["gpt-oss-20b", "--dtype", "nvfp5"],
            "KV formats the selected plugins declare: nvfp4 (NVFP4AttentionSpec of plugin",
        ),
        (["gpt-oss-20b", "--dtype", "nvfp4"], "does not store the KV format 'nvfp4'"),
        (
            ["gpt-oss-20b", "--dtype", "nvfp4", "--disable", "nvfp4_attention"],
            "KV formats the selected plugins declare: none",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2(capsys, argv, message):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcore: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_every_option_is_in_the_cli_reference():
    text = (REPO / "docs" / "reference" / "cli.rst").read_text()
    section = text.split("\nkvcore plan\n---", 1)[1]
    section = re.split(r"\n[^\n]+\n-{3,}\n", section, maxsplit=1)[0]
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["plan"]
    options = [
        s for a in sub._actions for s in a.option_strings if s.startswith("--") and s != "--help"
    ]
    assert len(options) == 16
    missing = [o for o in options if f".. option:: {o}" not in section]
    assert not missing


def test_the_group_table_widens_a_column_for_a_page_of_several_parts():
    import types

    from kvcore._planning.kv_cache_plan import group_table

    def group(index: int, kind: str, pages: tuple[int, ...]) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            index=index,
            kind=kind,
            num_layers=2,
            layer_names=["model.layers.0.a", "model.layers.1.a"],
            block_size=16,
            page_sizes=pages,
            pages_per_request=257,
            wasted_bytes_per_block=0,
        )

    groups = [group(0, "full_attention", (32768,)), group(1, "mla", (36864, 18432, 4608))]
    header, *rows = group_table(groups)
    page = "36.00 KiB/18.00 KiB/4.50 KiB"
    assert page in rows[1]
    # Every column starts where its header does: the page column ends under "page".
    end = header.index("page") + len("page")
    assert rows[1][:end].endswith(page)
    assert rows[0][:end].endswith("32.00 KiB")
    assert rows[1][end:].split() == ["257", "0", "B"]
    # A usual table keeps its layout.
    header, row = group_table(groups[:1])
    assert header == (
        "group  type                     layers  which                   block        page"
        "  blocks/req  waste/block"
    )
