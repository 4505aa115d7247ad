"""Request traces: reading JSONL workloads into requests.

Two line formats are read, told apart per line by their fields:

*Mooncake* (``hash_ids``)
    ``{"timestamp": 27482, "input_length": 6955, "output_length": 52,
    "hash_ids": [46, 47, 48, 2353]}``: an arrival time in milliseconds, the
    prompt and output lengths, and one hash id per 512 prompt tokens, equal
    ids meaning equal content. The traces carry no token ids, so tokens are
    synthesised deterministically: hash id ``h`` expands to 512 tokens that
    are all ``h``, cut to ``input_length``. Equal ids give equal tokens and
    different ids different tokens at every position, so prefix sharing is
    exactly that of the trace at every block size.
*Explicit tokens* (``prompt_token_ids``)
    ``{"timestamp": 0, "prompt_token_ids": [1, 2, 3], "output_length": 8}``:
    the prompt's token ids (integers >= 0) given in full.

Both accept an optional ``request_id`` (default: the line number) and an
optional ``timestamp`` (default 0); other fields are ignored. Blank lines are
skipped. A malformed line raises :class:`TraceFormatError` naming the file,
the line number and the reason, or is skipped and counted when the reader is
asked to skip bad lines. A line longer than 64 MiB (64 Mi characters, some 8
M token ids) is always an error: a trace has one request per line, and a
file that is not one (``/dev/zero``) must not be read without end. A long
line that does not start as JSON (an object or array) is refused after its
first 64 KiB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import repeat
from pathlib import Path
from typing import Any, TextIO

import attrs

from kvcore.errors import TraceFormatError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "BadLine",
    "Trace",
    "TraceFormatError",
    "TraceRequest",
    "mooncake_token_ids",
    "read_mooncake_trace",
    "read_trace",
    "trace_request_to_json",
]

#: Prompt tokens covered by one Mooncake hash id.
MOONCAKE_BLOCK_TOKENS = 512
#: Token ids are signed 64-bit integers (what the sha256 block hash packs).
_MAX_TOKEN_ID = 2**63 - 1
#: The largest hash id: a synthesised token id is its block's hash id.
_MAX_HASH_ID = _MAX_TOKEN_ID
#: Characters a trace line may have (a request with some 8 M explicit token ids).
MAX_LINE_CHARS = 64 << 20
# Characters read at a time: a line longer than this must start as a JSON object.
_LINE_CHUNK = 64 << 10


@attrs.frozen(kw_only=True)
class TraceRequest:
    """One request of a workload.

    Exactly one of ``hash_ids`` (Mooncake) and ``token_ids`` (explicit) is
    set. Prompts of Mooncake requests are not stored: they are synthesised
    when asked for (:attr:`prompt_token_ids`), so a trace of 150 M prompt
    tokens costs memory only for the requests being simulated.

    Attributes:
        request_id: Unique id (the line number when the trace has none).
        arrival_ms: Arrival time in milliseconds from the start of the trace.
        input_length: Prompt tokens.
        output_length: Tokens to generate.
        hash_ids: Mooncake hash ids, one per 512 prompt tokens, or ``None``.
        token_ids: The prompt's token ids, or ``None``.
    """

    request_id: str
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt's token ids (a new list, synthesised for Mooncake requests)."""
        if self.token_ids is not None:
            return list(self.token_ids)
        return mooncake_token_ids(self.hash_ids or (), self.input_length)


@attrs.frozen
class BadLine:
    """A line a reader skipped.

    Attributes:
        line_no: 1-based line number.
        reason: Why the line was rejected.
    """

    line_no: int
    reason: str


@attrs.define
class Trace:
    """The requests read from a file, and the lines skipped.

    Attributes:
        path: The file read.
        requests: The requests, in file order.
        bad_lines: Lines skipped as malformed (only when skipping was asked).
    """

    path: Path
    requests: list[TraceRequest]
    bad_lines: list[BadLine] = attrs.field(factory=list)


def mooncake_token_ids(hash_ids: tuple[int, ...] | list[int], input_length: int) -> list[int]:
    """Expand Mooncake hash ids into ``input_length`` token ids: each id over its 512 tokens.

    The token at position ``p`` is ``hash_ids[p // 512]``. Two prompts then
    have equal token prefixes exactly as far as their hash ids agree (to the
    token), so every block size sees the trace's own prefix sharing. A
    prompt holds one integer object per hash id rather than one per token:
    a replay of a long trace builds and frees some 150 M prompt tokens.
    """
    tokens: list[int] = []
    extend = tokens.extend
    for hash_id in hash_ids[: -(-input_length // MOONCAKE_BLOCK_TOKENS)]:
        extend(repeat(hash_id, MOONCAKE_BLOCK_TOKENS))
    del tokens[input_length:]
    return tokens


def trace_request_to_json(request: TraceRequest) -> str:
    """One JSONL line (no newline) that :func:`read_trace` reads back as ``request``."""
    record: dict[str, object] = {"timestamp": request.arrival_ms}
    if float(request.arrival_ms).is_integer():
        record["timestamp"] = int(request.arrival_ms)
    if request.hash_ids is not None:
        record["input_length"] = request.input_length
        record["output_length"] = request.output_length
        record["hash_ids"] = list(request.hash_ids)
    else:
        record["prompt_token_ids"] = list(request.token_ids or ())
        record["output_length"] = request.output_length
    record["request_id"] = request.request_id
    return json.dumps(record, separators=(", ", ": "))


class _BadLineError(Exception):
    """Internal: a line's reason for rejection, before the file and line are attached."""


class _LongLineError(Exception):
    """Internal: a line past :data:`MAX_LINE_CHARS` (always fatal: it cannot be skipped)."""


def _read_line(handle: TextIO, skip_bad_lines: bool) -> str:
    """The next line (``""`` at the end), read in chunks and bounded in length.

    Raises:
        _BadLineError: a long line that does not start as a JSON object or
            array (raised after its first chunk unless bad lines are skipped,
            which needs the rest of it read).
        _LongLineError: a line past :data:`MAX_LINE_CHARS`.
        UnicodeDecodeError: the text is not UTF-8.
    """
    text = handle.readline(_LINE_CHUNK)
    if not text or text.endswith("\n"):
        return text
    start = text.lstrip()[:1]
    hopeless = start not in ("", "{", "[")  # no JSON object or array starts so
    if hopeless:
        if not skip_bad_lines:
            msg = f"not a JSON object (the line starts with {start!r}; one request per line)"
            raise _BadLineError(msg)
        text = start
    parts, size = [text], len(text)
    while not parts[-1].endswith("\n"):
        chunk = handle.readline(_LINE_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_LINE_CHARS:
            raise _LongLineError
        if hopeless:
            parts = [start, chunk[-1:]]  # only whether it ended matters
        else:
            parts.append(chunk)
    return "".join(parts)


def _is_int(value: object) -> bool:
    return type(value) is int


def _parse_record(record: object, line_no: int) -> TraceRequest:
    """The request of one JSON line; the fields are checked in the order documented."""
    if not isinstance(record, dict):
        msg = "expected a JSON object"
        raise _BadLineError(msg)
    has_hashes = "hash_ids" in record
    has_tokens = "prompt_token_ids" in record
    if has_hashes and has_tokens:
        msg = "has both 'hash_ids' and 'prompt_token_ids'; give one of the two"
        raise _BadLineError(msg)
    if not has_hashes and not has_tokens:
        msg = "missing field 'hash_ids' (Mooncake format) or 'prompt_token_ids'"
        raise _BadLineError(msg)
    common = _common_fields(record, line_no)
    if has_hashes:
        return _hashes_request(record, **common)
    return _tokens_request(record, **common)


def _common_fields(record: dict[str, Any], line_no: int) -> dict[str, Any]:
    """``request_id``, ``arrival_ms`` and ``output_length``, checked, as keyword arguments."""
    if "output_length" not in record:
        msg = "missing field 'output_length'"
        raise _BadLineError(msg)
    output_length = record["output_length"]
    if not _is_int(output_length) or output_length < 0:
        msg = f"output_length must be an integer >= 0, got {output_length!r}"
        raise _BadLineError(msg)
    timestamp = record.get("timestamp", 0)
    if type(timestamp) not in (int, float) or not timestamp >= 0 or timestamp == float("inf"):
        msg = f"timestamp must be a finite number >= 0 (milliseconds), got {timestamp!r}"
        raise _BadLineError(msg)
    request_id = record.get("request_id", line_no)
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        msg = f"request_id must be a string or an integer, got {request_id!r}"
        raise _BadLineError(msg)
    return {
        "request_id": str(request_id),
        "arrival_ms": float(timestamp),
        "output_length": output_length,
    }


def _hashes_request(record: dict[str, Any], **common: Any) -> TraceRequest:
    """A Mooncake line: ``input_length`` tokens described by one hash id a block."""
    if "input_length" not in record:
        msg = "missing field 'input_length'"
        raise _BadLineError(msg)
    input_length = record["input_length"]
    hash_ids = record["hash_ids"]
    if not _is_int(input_length) or input_length <= 0:
        msg = f"input_length must be a positive integer, got {input_length!r}"
        raise _BadLineError(msg)
    if not isinstance(hash_ids, list) or not all(_is_int(h) and h >= 0 for h in hash_ids):
        msg = "hash_ids must be a list of integers >= 0"
        raise _BadLineError(msg)
    largest = max(hash_ids, default=0)
    if largest > _MAX_HASH_ID:
        msg = (
            f"hash id {largest} is too large: it is the token id of its 512 tokens, "
            f"and token ids are signed 64-bit integers (at most {_MAX_HASH_ID})"
        )
        raise _BadLineError(msg)
    covered = len(hash_ids) * MOONCAKE_BLOCK_TOKENS
    if covered < input_length:
        msg = (
            f"{len(hash_ids)} hash_ids cover {covered} tokens, fewer than "
            f"input_length={input_length}"
        )
        raise _BadLineError(msg)
    needed = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    return TraceRequest(input_length=input_length, hash_ids=tuple(hash_ids[:needed]), **common)


def _is_token_id(value: object) -> bool:
    return _is_int(value) and 0 <= value <= _MAX_TOKEN_ID  # type: ignore[operator]


def _tokens_request(record: dict[str, Any], **common: Any) -> TraceRequest:
    """A line of token ids (``prompt_token_ids``; ``input_length``, if given, must match)."""
    token_ids = record["prompt_token_ids"]
    if not isinstance(token_ids, list) or not token_ids or not all(map(_is_token_id, token_ids)):
        msg = "prompt_token_ids must be a non-empty list of integers in 0..2**63 - 1"
        if isinstance(token_ids, list):
            bad = next((i for i, t in enumerate(token_ids) if not _is_token_id(t)), None)
            if bad is not None:
                msg += f" (position {bad} is {token_ids[bad]!r})"
        raise _BadLineError(msg)
    input_length = record.get("input_length", len(token_ids))
    if input_length != len(token_ids):
        msg = f"input_length={input_length!r} but prompt_token_ids has {len(token_ids)} ids"
        raise _BadLineError(msg)
    return TraceRequest(input_length=len(token_ids), token_ids=tuple(token_ids), **common)


def _json_record(text: str) -> object:
    """The JSON value of one line.

    Raises:
        _BadLineError: not JSON, nested too deeply, or an integer Python
            will not read (more than 4300 digits).
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"not valid JSON ({exc.msg} at column {exc.colno})"
        raise _BadLineError(msg) from None
    except RecursionError:
        msg = "JSON nested too deeply (a request is one flat object)"
        raise _BadLineError(msg) from None
    except ValueError:
        # Python refuses to read integers of more than 4300 digits.
        msg = "not valid JSON: an integer has more than 4300 digits (no field takes one so large)"
        raise _BadLineError(msg) from None


def _iter_lines(
    path: Path, limit: int | None, skip_bad_lines: bool, bad_lines: list[BadLine]
) -> Iterator[TraceRequest]:
    if limit is not None and (type(limit) is not int or limit < 1):
        msg = f"limit must be a positive integer, got {limit!r}"
        raise TraceFormatError(msg)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read trace {path}: {exc.strerror or exc}"
        raise TraceFormatError(msg) from None
    count = 0
    seen_ids: set[str] = set()
    with handle:
        line_no = 0
        while True:
            if limit is not None and count >= limit:
                return
            try:
                text = _read_line(handle, skip_bad_lines)
            except UnicodeDecodeError as exc:
                msg = f"{path}:{line_no + 1}: not UTF-8 text ({exc.reason})"
                raise TraceFormatError(msg) from None
            except _LongLineError:
                msg = (
                    f"{path}:{line_no + 1}: the line is longer than 64 MiB: a trace has one "
                    "request (a JSON object) per line"
                )
                raise TraceFormatError(msg) from None
            except _BadLineError as exc:
                msg = f"{path}:{line_no + 1}: {exc}; fix the line or pass --skip-bad-lines"
                raise TraceFormatError(msg) from None
            if not text:
                return
            line_no += 1
            if not text.strip():
                continue
            try:
                request = _parse_record(_json_record(text), line_no)
                if request.request_id in seen_ids:
                    msg = f"request_id {request.request_id!r} already used by an earlier line"
                    raise _BadLineError(msg)
            except _BadLineError as exc:
                if not skip_bad_lines:
                    msg = f"{path}:{line_no}: {exc}; fix the line or pass --skip-bad-lines"
                    raise TraceFormatError(msg) from None
                bad_lines.append(BadLine(line_no, str(exc)))
                continue
            seen_ids.add(request.request_id)
            yield request
            count += 1


def read_trace(
    path: str | Path, *, limit: int | None = None, skip_bad_lines: bool = False
) -> Trace:
    """Read a JSONL workload (Mooncake or explicit-token lines, mixed freely).

    Args:
        path: The JSONL file.
        limit: Keep the first ``limit`` good requests (>= 1); ``None`` for all.
        skip_bad_lines: Skip malformed lines and list them in
            :attr:`Trace.bad_lines` instead of raising.

    Raises:
        TraceFormatError: the file cannot be read, or a line is malformed and
            ``skip_bad_lines`` is off (the message gives file, line number and
            reason).
    """
    path = Path(path)
    bad_lines: list[BadLine] = []
    requests = list(_iter_lines(path, limit, skip_bad_lines, bad_lines))
    return Trace(path=path, requests=requests, bad_lines=bad_lines)


def read_mooncake_trace(path: str | Path, *, limit: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a JSONL trace in file order, stopping at the first bad line.

    Args:
        path: The JSONL file.
        limit: Stop after this many requests.

    Raises:
        TraceFormatError: a line is malformed (the message gives file, line
            number and reason).
    """
    return _iter_lines(Path(path), limit, False, [])
