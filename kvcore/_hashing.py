"""Chained block hashes: the keys of the prefix cache.

A block's hash covers its parent's hash, its token ids and its *extra keys*
(LoRA adapter, multimodal inputs overlapping the block with their offsets, and
the cache salt on the first block). So equal hashes mean equal prefixes, not
just equal blocks, and a lookup can stop at the first miss.

Three algorithms:

``"sha256"`` (default)
    SHA-256 over a canonical byte encoding: the 32-byte parent digest, the
    token ids as little-endian signed 64-bit integers, then (if any) a tagged
    encoding of the extra keys. Collision resistant and identical across
    processes and machines, so caches and events can be compared between
    workers.
``"fast"``
    Python's built-in ``hash`` of ``(parent, tokens, extra keys)``: a 64-bit
    integer, several times cheaper, for simulation. Not collision resistant;
    with string extra keys (LoRA names, salts) the values differ between
    processes unless ``PYTHONHASHSEED`` is fixed.
``"xxh3_128"``
    XXH3 with a 128-bit digest (the ``xxhash`` package: ``pip install
    'kvcore[xxhash]'``) over the same byte encoding as ``"sha256"``, with a
    16-byte parent digest. About twice as fast as ``"sha256"`` per block and,
    like it, identical across processes and machines, so multi-process
    engines can compare caches and events. Not cryptographic: a client that
    controls prompts could craft a collision, so engines that share one cache
    between untrusted tenants should keep ``"sha256"``.
"""

from __future__ import annotations

import hashlib
import operator
import struct
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, NoReturn, cast, overload

from kvcore._backend import ChainFunction, native_chain
from kvcore._request import Request
from kvcore.errors import InvalidConfigError, InvalidRequestError, RequestStateError

__all__ = [
    "DIGEST_SIZES",
    "INT_HASH_ALGORITHMS",
    "HASH_ALGORITHMS",
    "NONE_HASH_SHA256",
    "BlockHasher",
    "BlockHashView",
    "block_extra_keys",
    "encode_extra_keys",
]

#: The names accepted by ``BlockHasher(algorithm=...)``.
HASH_ALGORITHMS: Final = ("sha256", "fast", "xxh3_128")

#: Bytes of each block hash an algorithm makes (``"fast"`` makes ints: absent).
DIGEST_SIZES: Final = {"sha256": 32, "xxh3_128": 16}
#: Algorithms whose block hashes are ints in the signed 64-bit range.
INT_HASH_ALGORITHMS: Final = frozenset({"fast"})

#: Parent digest of a request's first block under ``"sha256"``.
NONE_HASH_SHA256: Final = hashlib.sha256(b"kvcore/none-hash/v1").digest()
_NONE_HASH_FAST: Final = hash(("kvcore/none-hash/v1",))

_sha256 = hashlib.sha256
_NONE_HASH_SEED: Final = b"kvcore/none-hash/v1"


def _xxh3_128_digest() -> Callable[[bytes], bytes]:
    """``xxhash.xxh3_128_digest``, imported when a hasher asks for ``"xxh3_128"``."""
    try:
        from xxhash import xxh3_128_digest
    except ImportError:
        msg = (
            "hash_algorithm 'xxh3_128' needs the xxhash package: "
            "pip install 'kvcore[xxhash]' (or use 'sha256')"
        )
        raise InvalidConfigError(msg) from None
    return xxh3_128_digest


def _chain_digests(
    digest: Callable[[bytes], bytes], parent: bytes, data: bytes, step: int, out: list[Hashable]
) -> None:
    """Append ``digest(parent + chunk)`` for every ``step``-byte chunk of ``data``, chained."""
    append = out.append
    view = memoryview(data)
    for offset in range(0, len(data), step):
        parent = digest(parent + view[offset : offset + step])
        append(parent)


def _token_bytes(tokens: list[int]) -> bytes:
    # struct packs a list several times faster than array("q", ...).tobytes().
    return struct.pack(f"<{len(tokens)}q", *tokens)


def _refuse_token_ids(request: Request, start: int, end: int) -> NoReturn:
    """Raise for the first token id in ``[start, end)`` that is not a 64-bit integer.

    Called only once packing failed: the scan costs nothing on good input.
    """
    tokens = request._all_token_ids
    for position in range(start, end):
        token = tokens[position]
        try:
            struct.pack("<q", token)
        except struct.error:
            try:
                operator.index(token)
            except TypeError:
                why = "not an integer"
            else:
                why = "outside the signed 64-bit range"
            msg = (
                f"request {request.request_id!r}: token id at position {position} is "
                f"{token!r}, {why}; token ids are integers in -2**63..2**63 - 1"
            )
            raise InvalidRequestError(msg) from None
    msg = f"request {request.request_id!r}: token ids {start}..{end - 1} cannot be hashed"
    raise InvalidRequestError(msg)


def _checked_token_bytes(request: Request, start: int, end: int) -> bytes:
    """The packed token ids ``[start, end)`` of ``request``, refusing ids that are not int64."""
    try:
        return _token_bytes(request._all_token_ids[start:end])
    except struct.error:
        _refuse_token_ids(request, start, end)


def _embeds_digest(embeds: Any, start: int, end: int) -> bytes:
    """SHA-256 of rows ``[start, end)`` of prompt embeddings, with their dtype and row shape.

    Accepts a numpy array or a torch tensor (any dtype, bfloat16 included).
    """
    rows = embeds[start:end]
    tobytes = getattr(rows, "tobytes", None)
    if tobytes is not None:  # numpy
        header = f"{rows.dtype.str}{tuple(rows.shape[1:])}"
        data = tobytes()
    else:  # torch: view the bytes, so that dtypes numpy lacks hash too
        import torch

        header = f"{rows.dtype}{tuple(rows.shape[1:])}"
        flat = rows.detach().to("cpu").contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes()
    return _sha256(header.encode() + b"\x00" + data).digest()


def encode_extra_keys(keys: tuple[object, ...]) -> bytes:
    """Encode extra keys (nested tuples of str, int, bytes, None) canonically.

    Every value is tagged with its type and length, so distinct key tuples
    never encode to the same bytes.

    Raises:
        TypeError: a key has a type with no canonical encoding.
    """
    out = bytearray()
    _encode_into(keys, out)
    return bytes(out)


def _encode_into(value: object, out: bytearray) -> None:
    if value is None:
        out += b"N"
    elif isinstance(value, tuple):
        out += b"T" + len(value).to_bytes(4, "little")
        for item in value:
            _encode_into(item, out)
    elif isinstance(value, str):
        data = value.encode()
        out += b"S" + len(data).to_bytes(4, "little") + data
    elif isinstance(value, bytes):
        out += b"B" + len(value).to_bytes(4, "little") + value
    elif isinstance(value, int) and not isinstance(value, bool):
        size = value.bit_length() // 8 + 1
        out += b"I" + size.to_bytes(1, "little") + value.to_bytes(size, "little", signed=True)
    else:
        msg = f"extra hash key {value!r} has no canonical encoding (use str, int, bytes)"
        raise TypeError(msg)


def block_extra_keys(request: Request, start: int, end: int) -> tuple[object, ...] | None:
    """Return the extra hash keys of the block covering tokens ``[start, end)``.

    The keys, in this order: ``("lora", name)`` when the request has a LoRA
    adapter; ``("mm", identifier, offset - start)`` for every multimodal input
    overlapping the block (the offset is relative to the block, negative when
    the input began in an earlier block); ``("salt", salt)`` on the block that
    starts at token 0 when the request has a cache salt; ``("embeds",
    digest)`` for a block overlapping the prompt when the request has prompt
    embeddings (SHA-256 of the block's rows, dtype and row shape). ``None``
    when there are none.
    """
    keys: list[object] = []
    if request.lora_name:
        keys.append(("lora", request.lora_name))
    for feature in request.mm_features:
        if feature.offset >= end:
            break
        if feature.offset + feature.length > start:
            keys.append(("mm", feature.identifier, feature.offset - start))
    if start == 0 and request.cache_salt:
        keys.append(("salt", request.cache_salt))
    if request.prompt_embeds is not None and start < request.num_prompt_tokens:
        stop = min(end, request.num_prompt_tokens)
        keys.append(("embeds", _embeds_digest(request.prompt_embeds, start, stop)))
    return tuple(keys) if keys else None


class BlockHasher:
    """Extends a request's chained block hashes as its tokens grow.

    Args:
        block_size: Tokens per hashed unit (the manager's hash block size).
        algorithm: ``"sha256"``, ``"fast"`` or ``"xxh3_128"`` (see the module
            documentation).
        native: Compute the hashes of requests without extra keys in compiled
            code where it is built (``"sha256"`` and ``"fast"``); the values
            and errors are those of the Python code, which serves otherwise.

    Raises:
        InvalidConfigError: a bad block size or algorithm, or ``"xxh3_128"``
            without the ``xxhash`` package.
    """

    __slots__ = (
        "_chain",
        "_chain_seed",
        "_digest",
        "_key",
        "_none_hash",
        "algorithm",
        "block_size",
    )

    def __init__(self, block_size: int, algorithm: str = "sha256", *, native: bool = False) -> None:
        if type(block_size) is not int or block_size <= 0:
            msg = f"hash block_size must be a positive integer, got {block_size!r}"
            raise InvalidConfigError(msg)
        if algorithm not in HASH_ALGORITHMS:
            msg = f"hash_algorithm must be one of {HASH_ALGORITHMS}, got {algorithm!r}"
            raise InvalidConfigError(msg)
        self.block_size = block_size
        self.algorithm = algorithm
        self._key = (block_size, algorithm)
        # The byte-level digest of "xxh3_128" (None for the other algorithms).
        self._digest = _xxh3_128_digest() if algorithm == "xxh3_128" else None
        self._none_hash = self._digest(_NONE_HASH_SEED) if self._digest is not None else None
        # The compiled twin of the loops below (kvcore/_native_hash.c), or None.
        self._chain: ChainFunction | None = native_chain(algorithm) if native else None
        # The parent of a request's first block in the compiled chain.
        self._chain_seed = NONE_HASH_SHA256 if algorithm == "sha256" else _NONE_HASH_FAST

    def update(self, request: Request) -> None:
        """Append the hashes of every newly completed block to ``request.block_hashes``.

        Cheap when no block was completed since the last call (one length
        comparison), so managers call it on every operation.

        Raises:
            InvalidRequestError: a token id of a completed block is not an
                integer in the signed 64-bit range (nothing is appended).
            RequestStateError: the request was hashed before with another
                block size or algorithm (it belongs to another manager).
        """
        if request._hash_key is not self._key:
            self._claim(request)
        hashes = request.block_hashes
        tokens = request._all_token_ids
        size = self.block_size
        start = len(hashes) * size
        num_new = (len(tokens) - start) // size
        if num_new <= 0:
            return
        if self._chain is not None and not request.needs_extra_hash_keys:
            parent = hashes[-1] if hashes else self._chain_seed
            if self._chain(tokens, start, num_new, size, parent, hashes):
                return
            # Refused (an id that is not a plain int64, say): the code below decides.
        end = start + num_new * size
        # Packing checks every id (an int64, or refused with its position);
        # the sha256 path hashes the packed bytes, the others only check.
        data = _checked_token_bytes(request, start, end)
        if request.needs_extra_hash_keys:
            self._extend_with_extra_keys(request, start, end)
        elif self.algorithm == "sha256":
            parent = hashes[-1] if hashes else NONE_HASH_SHA256
            step = 8 * size
            append = hashes.append
            for offset in range(0, len(data), step):
                parent = _sha256(parent + data[offset : offset + step]).digest()  # type: ignore[operator]
                append(parent)
        elif self._digest is not None:
            parent = hashes[-1] if hashes else self._none_hash
            _chain_digests(self._digest, parent, data, 8 * size, hashes)  # type: ignore[arg-type]
        else:
            parent = hashes[-1] if hashes else _NONE_HASH_FAST
            append = hashes.append
            for offset in range(start, end, size):
                parent = hash((parent, tuple(tokens[offset : offset + size])))
                append(parent)

    def _claim(self, request: Request) -> None:
        if request._hash_key is not None and request._hash_key != self._key:
            bs, algo = cast("tuple[int, str]", request._hash_key)
            msg = (
                f"request {request.request_id!r} was hashed with block size {bs} and "
                f"{algo!r}, but this manager hashes with block size {self.block_size} and "
                f"{self.algorithm!r}; a Request belongs to one KVCacheManager"
            )
            raise RequestStateError(msg)
        request._hash_key = self._key

    def _extend_with_extra_keys(self, request: Request, start: int, end: int) -> None:
        hashes = request.block_hashes
        tokens = request._all_token_ids
        size = self.block_size
        sha = self.algorithm == "sha256"
        digest = self._digest
        none_hash: Hashable = (
            NONE_HASH_SHA256 if sha else self._none_hash if digest else _NONE_HASH_FAST
        )
        parent = hashes[-1] if hashes else none_hash
        for offset in range(start, end, size):
            extra = block_extra_keys(request, offset, offset + size)
            chunk = tokens[offset : offset + size]
            if sha or digest is not None:
                data = parent + _token_bytes(chunk)  # type: ignore[operator]
                if extra is not None:
                    data += b"\x01" + encode_extra_keys(extra)
                parent = _sha256(data).digest() if sha else digest(data)  # type: ignore[misc]
            else:
                parent = hash((parent, tuple(chunk), extra))
            hashes.append(parent)


class BlockHashView(Sequence[Hashable]):
    """A request's hashes seen at a coarser block size (a multiple of the hash unit).

    Element ``i`` is the hash of the last unit inside block ``i``; because the
    hashes are chained, it identifies the whole prefix up to the end of the
    block. Lengths count whole blocks only.

    Args:
        hashes: Hashes at the unit size.
        scale: Units per block (>= 1).
    """

    __slots__ = ("_hashes", "_scale")

    def __init__(self, hashes: Sequence[Hashable], scale: int) -> None:
        self._hashes = hashes
        self._scale = scale

    def __len__(self) -> int:
        return len(self._hashes) // self._scale

    @overload
    def __getitem__(self, index: int) -> Hashable: ...
    @overload
    def __getitem__(self, index: slice) -> list[Hashable]: ...
    def __getitem__(self, index: int | slice) -> Hashable | list[Hashable]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            scale = self._scale
            return [self._hashes[(i + 1) * scale - 1] for i in range(start, stop, step)]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            msg = "block hash index out of range"
            raise IndexError(msg)
        return self._hashes[(index + 1) * self._scale - 1]


def hashes_at_block_size(
    hashes: Sequence[Hashable], hash_block_size: int, block_size: int
) -> Sequence[Hashable]:
    """Return ``hashes`` (computed every ``hash_block_size`` tokens) seen per ``block_size``."""
    if block_size == hash_block_size:
        return hashes
    return BlockHashView(hashes, block_size // hash_block_size)
