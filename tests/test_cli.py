"""The ``kvcore`` command line (``kvcore plugins``)."""

from __future__ import annotations

import json
import subprocess
import sys

from kvcore._cli.main import main


def test_plugins_lists_each_plugin_with_its_types(capsys):
    assert main(["plugins", "--only", "full_attention"]) == 0
    out = capsys.readouterr().out
    assert "full_attention  (kvcore " in out
    assert "kvcore_plugins.full_attention.spec.FullAttentionSpec  [full_attention]" in out
    assert "managed by kvcore_plugins.full_attention.manager.FullAttentionManager" in out
    assert "[not loaded: left out by the selection]" in out  # the example plugin
    assert out.rstrip().endswith("installed plugins loaded")


def test_plugins_json(capsys):
    assert main(["plugins", "--json", "--disable", "compressed"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["compressed"]["loaded"] is False
    full = rows["full_attention"]
    assert full["loaded"] is True
    assert full["distribution"] == "kvcore"
    assert full["layer_types"] == [
        {
            "spec": "kvcore_plugins.full_attention.spec.FullAttentionSpec",
            "kind": "full_attention",
            "manager": "kvcore_plugins.full_attention.manager.FullAttentionManager",
            "kv_formats": [],
        }
    ]
    (nvfp4,) = rows["nvfp4_attention"]["layer_types"]
    assert nvfp4["kv_formats"] == [
        {"name": "nvfp4", "description": "4-bit E2M1 values, one E4M3 scale per 16 values"}
    ]


def test_plugins_lists_the_formats_a_type_stores(capsys):
    assert main(["plugins", "--only", "nvfp4_attention"]) == 0
    out = capsys.readouterr().out
    assert (
        "        stores KV format nvfp4 (4-bit E2M1 values, one E4M3 scale per 16 values)\n"
        "    layer kinds: nvfp4_attention\n" in out
    )


def test_errors_are_one_line_with_exit_status_2(capsys):
    assert main(["plugins", "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcore: error: kvcore plugins named in only= / KVCORE_PLUGINS")
    assert err.count("\n") == 1


def test_the_console_script_is_installed():
    out = subprocess.run(
        [sys.executable, "-m", "kvcore._cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout.startswith("kvcore ")


def test_plan_with_num_blocks_and_a_given_length_says_so(capsys):
    # 20 blocks of 384 KiB (gpt-oss-20b: 24 layers x 16 tokens x 8 heads x 128 x 2 bytes)
    # = 7.50 MiB; the memory default (80 GiB) sized nothing, and 128 was asked for.
    assert main(["plan", "gpt-oss-20b", "--num-blocks", "20", "--max-model-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "20 blocks given (7.50 MiB), max_model_len 128 (given; model maximum 131072)" in out
    assert "80.00 GiB" not in out
    assert "lowered" not in out


def test_plan_fitting_the_length_still_notes_it(capsys):
    assert main(["plan", "gpt-oss-20b", "--memory", "12MiB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_model_len_fitted"] is True
    assert data["num_blocks_given"] is False
    assert data["notes"][-1].startswith("max_model_len lowered from the model's 131072 to ")


def test_out_of_memory_advice_names_the_batched_tokens_budget(capsys):
    # 256 tokens: the window group keeps min(127 + 8192, 256) = 256 tokens (16 blocks + 1
    # for a window starting mid-block), the full group 16, plus the null block: 34 x 384
    # KiB = 12.75 MiB > 12 MiB. With a budget of 97 the window keeps 224 tokens (14 + 1
    # blocks): 32 blocks = 12 MiB.
    assert main(["plan", "gpt-oss-20b", "--memory", "12MiB", "--max-model-len", "256"]) == 2
    err = capsys.readouterr().err
    assert "lower max_num_batched_tokens (now 8192) to at most 97" in err
