"""Every bad input to the ``kvcore`` command is one line on stderr and exit status 2.

One test per class of bad input: the line names the file and line (or the
option) and says what to do; no traceback, nothing on stdout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvcore._cli.main import main


def run(capsys, *argv: str) -> str:
    """Run ``kvcore argv``: it must fail with one line on stderr; return that line."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert err.startswith("kvcore: error: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def record(**fields: object) -> str:
    return json.dumps(fields) + "\n"


SIMULATE = ("simulate", "llama-3-8b", "--memory", "1GiB", "--hash", "sha256")


def test_deeply_nested_json_in_a_trace(tmp_path, capsys):
    """It raised RecursionError."""
    trace = write(tmp_path, "nested.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")
    line = run(capsys, *SIMULATE, "--trace", trace)
    assert f"{trace}:1: JSON nested too deeply" in line
    assert "fix the line or pass --skip-bad-lines" in line


def test_deeply_nested_json_is_a_bad_line_to_skip(tmp_path, capsys):
    trace = write(
        tmp_path,
        "nested.jsonl",
        "[" * 100_000 + "]" * 100_000 + "\n" + record(prompt_token_ids=[1, 2, 3], output_length=1),
    )
    assert main([*SIMULATE, "--trace", trace, "--skip-bad-lines", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workload"]["bad_lines"] == 1


def test_the_largest_hash_id_is_a_valid_token_id(tmp_path, capsys):
    trace = write(
        tmp_path,
        "largest.jsonl",
        record(timestamp=0, input_length=40, output_length=2, hash_ids=[2**63 - 1]),
    )
    assert main([*SIMULATE, "--trace", trace, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workload"]["requests"] == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # With sha256 the synthesised token ids overflowed a raw struct.error.
        (
            {"input_length": 600, "output_length": 2, "hash_ids": [7, 2**63]},
            r"hash id 9223372036854775808 is too large: it is the token id of its 512 "
            r"tokens, and token ids are signed 64-bit integers \(at most 9223372036854775807\)",
        ),
        (
            {"input_length": 40, "output_length": 2, "hash_ids": [2**63]},
            r"hash id 9223372036854775808 is too large",
        ),
        (
            {"prompt_token_ids": [1, 2**63, *range(30)], "output_length": 2},
            r"prompt_token_ids must be a non-empty list of integers in 0\.\.2\*\*63 - 1 "
            r"\(position 1 is 9223372036854775808\)",
        ),
    ],
)
def test_ids_past_64_bits_in_a_trace(tmp_path, capsys, fields, message):
    trace = write(tmp_path, "big.jsonl", record(timestamp=0, **fields))
    line = run(capsys, *SIMULATE, "--trace", trace)
    assert f"{trace}:1: " in line
    assert re.search(message, line), line


def test_an_empty_trace(tmp_path, capsys):
    """It was reported on as a run of zero requests."""
    for text in ("", "\n\n"):
        trace = write(tmp_path, "empty.jsonl", text)
        line = run(capsys, *SIMULATE, "--trace", trace)
        assert line == (
            f"kvcore: error: {trace} holds no requests; give a JSONL trace with one request per "
            "line (see 'kvcore workload' for the format)"
        )


def test_a_trace_with_only_bad_lines_even_when_skipping(tmp_path, capsys):
    trace = write(tmp_path, "bad.jsonl", "{}\nnot json\n")
    line = run(capsys, *SIMULATE, "--trace", trace, "--skip-bad-lines")
    assert line == (
        f"kvcore: error: every line of {trace} is malformed (2 skipped); the first, line 1: "
        "missing field 'hash_ids' (Mooncake format) or 'prompt_token_ids'"
    )


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--step-ms", "inf", "step_ms must be a finite number >= 0, got inf"),
        ("--step-ms", "nan", "step_ms must be a finite number >= 0, got nan"),
        ("--step-ms", "-1", "step_ms must be a finite number >= 0, got -1.0"),
        ("--token-us", "inf", "token_us must be a finite number >= 0, got inf"),
    ],
)
def test_step_costs_must_be_finite(tmp_path, capsys, option, value, message):
    """An infinite step cost was reported on (every time figure infinite)."""
    trace = write(tmp_path, "ok.jsonl", record(prompt_token_ids=[1, 2, 3], output_length=2))
    line = run(capsys, *SIMULATE, "--trace", trace, option, value)
    assert line == f"kvcore: error: {message}"


def test_a_workload_rate_must_be_finite(capsys):
    """An infinite rate never finished generating."""
    line = run(capsys, "workload", "-", "--requests", "3", "--rate", "inf")
    assert line == (
        "kvcore: error: GeneratorConfig.conversations_per_s must be a finite number > 0, got inf"
    )


def test_memory_a_pool_cannot_address(capsys):
    """1000 TiB built per-block lists of billions of entries and took the machine down."""
    line = run(capsys, "simulate", "gpt-oss-20b", "--memory", "1000TiB", "--limit", "5")
    assert "num_blocks=2796202666 (1000.00 TiB in blocks of 393216 bytes)" in line
    assert "is more than a pool can address" in line
    assert "block tables hold int32 ids (at most 2147483647 blocks)" in line
    assert "plan with less memory or fewer blocks" in line


def test_a_plan_for_memory_a_pool_cannot_address(capsys):
    line = run(capsys, "plan", "gpt-oss-20b", "--memory", "1000TiB")
    assert "num_blocks=2796202666" in line
    assert "block tables hold int32 ids" in line


def test_memory_whose_pool_bookkeeping_the_host_cannot_hold(capsys, monkeypatch):
    from kvcore import _block_pool

    monkeypatch.setattr(_block_pool, "available_host_memory", lambda: 8 * 2**30)
    line = run(capsys, "simulate", "llama-3-8b", "--memory", "1000TiB", "--limit", "5")
    assert "a pool of 524288000 blocks needs about 19.53 GiB of host memory" in line
    assert "but only 8.00 GiB is available" in line


def test_max_model_len_minus_one_fits(capsys):
    assert (
        main(["plan", "llama-3-8b", "--memory", "512MiB", "--max-model-len", "-1", "--json"]) == 0
    )
    fitted = json.loads(capsys.readouterr().out)["max_model_len"]
    assert main(["plan", "llama-3-8b", "--memory", "512MiB", "--json"]) == 0
    assert fitted == json.loads(capsys.readouterr().out)["max_model_len"]
    line = run(capsys, "plan", "llama-3-8b", "--max-model-len", "0")
    assert "max_model_len must be a positive integer, or -1 to fit" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # Bad inputs that were already one line: the rule holds for them too.
        (("plan", "llama-3-8b", "--memory", "80G"), "cannot read memory amount '80G'"),
        (("plan", "llama-3-8b", "--num-blocks", "0"), "num_blocks must be a positive integer"),
        (("simulate", "--trace", "/no/such/trace.jsonl"), "cannot read trace /no/such/trace"),
        (("simulate", "--limit", "0"), "--limit must be a positive integer, got 0"),
        (("simulate", "--plot", "out.svg"), "give a file name ending in .png"),
        (("workload", "/no/such/dir/w.jsonl", "--requests", "2"), "cannot write workload"),
        (("plugins", "--only", "nope"), "kvcore plugins named in only="),
    ],
)
def test_other_bad_inputs_are_one_line_too(capsys, argv, message):
    assert message in run(capsys, *argv)
