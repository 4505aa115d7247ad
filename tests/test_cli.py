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
