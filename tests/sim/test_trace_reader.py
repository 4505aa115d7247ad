"""Reading JSONL traces: both line formats, token synthesis, malformed lines."""

from __future__ import annotations

import json

import pytest

from kvcore._trace import (
    TraceFormatError,
    mooncake_token_ids,
    read_mooncake_trace,
    read_trace,
    trace_request_to_json,
)


def write(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


MOONCAKE = '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [7, 9]}'
EXPLICIT = '{"prompt_token_ids": [1, 2, 3], "output_length": 2, "request_id": "x"}'


def test_mooncake_tokens_are_synthesised_from_hash_ids():
    tokens = mooncake_token_ids([7, 9, 11], 600)
    assert tokens == [7] * 512 + [9] * 88  # the third id covers no token
    assert mooncake_token_ids((5,), 1) == [5]


def test_mooncake_prompts_share_a_token_prefix_as_far_as_their_hash_ids():
    """At every block size a shared prefix ends where the hash ids first differ."""
    first = mooncake_token_ids([3, 4, 8], 1500)
    second = mooncake_token_ids([3, 4, 9], 1500)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    assert shared == 1024
    assert mooncake_token_ids([3, 4], 1024) == first[:1024]


def test_both_formats_mixed_in_one_file(tmp_path):
    trace = read_trace(write(tmp_path, [MOONCAKE, "", EXPLICIT]))
    first, second = trace.requests
    assert (first.request_id, first.arrival_ms, first.input_length) == ("1", 5.0, 600)
    assert first.prompt_token_ids == mooncake_token_ids([7, 9], 600)
    assert (second.request_id, second.arrival_ms, second.output_length) == ("x", 0.0, 2)
    assert second.prompt_token_ids == [1, 2, 3]
    assert trace.bad_lines == []


def test_round_trip_through_json(tmp_path):
    trace = read_trace(write(tmp_path, [MOONCAKE, EXPLICIT]))
    again = read_trace(write(tmp_path, [trace_request_to_json(r) for r in trace.requests]))
    assert again.requests == trace.requests


def test_limit_counts_good_requests(tmp_path):
    trace = read_trace(write(tmp_path, [MOONCAKE, "", EXPLICIT, MOONCAKE]), limit=2)
    assert [r.request_id for r in trace.requests] == ["1", "x"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"input_length": 5, "output_length": 1}', "missing field 'hash_ids'"),
        ('{"hash_ids": [1], "output_length": 1}', "missing field 'input_length'"),
        ('{"hash_ids": [1], "input_length": 5}', "missing field 'output_length'"),
        ('{"hash_ids": [1], "input_length": 600, "output_length": 1}', "1 hash_ids cover 512"),
        ('{"hash_ids": [-1], "input_length": 5, "output_length": 1}', "hash_ids must be a list"),
        ('{"hash_ids": [1], "input_length": 0, "output_length": 1}', "input_length must be"),
        ('{"hash_ids": [1], "input_length": 5, "output_length": -2}', "output_length must be"),
        (
            '{"hash_ids": [1], "input_length": 5, "output_length": 1, "timestamp": "soon"}',
            "timestamp must be",
        ),
        ('{"prompt_token_ids": [], "output_length": 1}', "non-empty list"),
        ('{"prompt_token_ids": [1, 2], "input_length": 3, "output_length": 1}', "has 2 ids"),
        (
            '{"prompt_token_ids": [1], "hash_ids": [1], "output_length": 1}',
            "both 'hash_ids' and 'prompt_token_ids'",
        ),
    ],
)
def test_malformed_line_names_file_line_and_reason(tmp_path, line, reason):
    path = write(tmp_path, [MOONCAKE, line])
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: ")
    assert reason in message
    assert "--skip-bad-lines" in message


def test_duplicate_request_ids_are_rejected(tmp_path):
    with pytest.raises(TraceFormatError, match=r":2: request_id 'x' already used"):
        read_trace(write(tmp_path, [EXPLICIT, EXPLICIT]))


def test_skip_bad_lines_counts_them(tmp_path):
    trace = read_trace(
        write(tmp_path, [MOONCAKE, "{oops", EXPLICIT, '{"hash_ids": []}']), skip_bad_lines=True
    )
    assert [r.request_id for r in trace.requests] == ["1", "x"]
    assert [b.line_no for b in trace.bad_lines] == [2, 4]
    assert "not valid JSON" in trace.bad_lines[0].reason


def test_unreadable_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")


def test_streaming_reader_stops_at_the_first_bad_line(tmp_path):
    iterator = read_mooncake_trace(write(tmp_path, [MOONCAKE, "{bad"]))
    assert next(iterator).request_id == "1"
    with pytest.raises(TraceFormatError, match=":2: not valid JSON"):
        next(iterator)


def test_trailing_hash_ids_beyond_the_prompt_are_dropped(tmp_path):
    line = json.dumps({"hash_ids": [1, 2, 3], "input_length": 10, "output_length": 1})
    (request,) = read_trace(write(tmp_path, [line])).requests
    assert request.hash_ids == (1,)
