"""Request traces: reading the Mooncake JSONL format into token-level requests.

A Mooncake trace line describes a request by ``input_length``,
``output_length``, an arrival ``timestamp`` in milliseconds, and ``hash_ids``:
one id per 512 prompt tokens, equal ids meaning equal content. The traces carry
no token ids, so tokens are synthesised deterministically: hash id ``h``
expands to tokens ``h * 512 + i`` for ``i`` in ``0..511``, cut to
``input_length``. Equal ids give equal tokens and different ids different
tokens, so prefix sharing is exactly that of the trace.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import attrs

from kvcore.errors import KVCoreError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TraceFormatError",
    "TraceRequest",
    "mooncake_token_ids",
    "read_mooncake_trace",
]

#: Prompt tokens covered by one Mooncake hash id.
MOONCAKE_BLOCK_TOKENS = 512


class TraceFormatError(KVCoreError, ValueError):
    """A trace line cannot be read; the message gives the file, line and reason."""


@attrs.frozen(kw_only=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        request_id: Unique id (the line number when the trace has none).
        arrival_ms: Arrival time in milliseconds from the start of the trace.
        prompt_token_ids: The prompt's token ids.
        output_length: Tokens to generate.
    """

    request_id: str
    arrival_ms: float
    prompt_token_ids: tuple[int, ...]
    output_length: int


def mooncake_token_ids(hash_ids: list[int], input_length: int) -> list[int]:
    """Expand Mooncake hash ids into ``input_length`` deterministic token ids."""
    tokens: list[int] = []
    for hash_id in hash_ids:
        base = hash_id * MOONCAKE_BLOCK_TOKENS
        tokens.extend(range(base, base + MOONCAKE_BLOCK_TOKENS))
        if len(tokens) >= input_length:
            break
    return tokens[:input_length]


def _fail(path: Path, line_no: int, reason: str) -> TraceFormatError:
    return TraceFormatError(f"{path}:{line_no}: {reason}")


def _parse_line(path: Path, line_no: int, text: str) -> TraceRequest:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(path, line_no, f"not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise _fail(path, line_no, "expected a JSON object")
    for key in ("input_length", "output_length", "hash_ids"):
        if key not in record:
            raise _fail(path, line_no, f"missing field {key!r}")
    input_length = record["input_length"]
    output_length = record["output_length"]
    hash_ids = record["hash_ids"]
    if type(input_length) is not int or input_length <= 0:
        raise _fail(path, line_no, f"input_length must be a positive integer, got {input_length!r}")
    if type(output_length) is not int or output_length < 0:
        raise _fail(path, line_no, f"output_length must be an integer >= 0, got {output_length!r}")
    if not isinstance(hash_ids, list) or not all(type(h) is int and h >= 0 for h in hash_ids):
        raise _fail(path, line_no, "hash_ids must be a list of integers >= 0")
    if len(hash_ids) * MOONCAKE_BLOCK_TOKENS < input_length:
        raise _fail(
            path,
            line_no,
            f"{len(hash_ids)} hash_ids cover {len(hash_ids) * MOONCAKE_BLOCK_TOKENS} tokens, "
            f"fewer than input_length={input_length}",
        )
    timestamp = record.get("timestamp", 0)
    if not isinstance(timestamp, int | float) or timestamp < 0:
        raise _fail(path, line_no, f"timestamp must be a number >= 0, got {timestamp!r}")
    return TraceRequest(
        request_id=str(record.get("request_id", line_no)),
        arrival_ms=float(timestamp),
        prompt_token_ids=tuple(mooncake_token_ids(hash_ids, input_length)),
        output_length=output_length,
    )


def read_mooncake_trace(path: str | Path, *, limit: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a Mooncake-format JSONL trace, in file order.

    Blank lines are ignored.

    Args:
        path: The JSONL file.
        limit: Stop after this many requests.

    Raises:
        TraceFormatError: a line is malformed (the message gives file, line
            number and reason).
    """
    path = Path(path)
    count = 0
    with path.open(encoding="utf-8") as lines:
        for line_no, text in enumerate(lines, start=1):
            if limit is not None and count >= limit:
                return
            if not text.strip():
                continue
            yield _parse_line(path, line_no, text)
            count += 1
