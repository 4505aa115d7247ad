"""The request object kvcore allocates KV cache for."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import attrs

from kvcore.errors import InvalidRequestError

__all__ = ["MultiModalFeature", "Request"]


@attrs.frozen(kw_only=True)
class MultiModalFeature:
    """A multimodal input (image, audio clip, ...) embedded in a prompt.

    Two prompts reuse each other's cached blocks only if the inputs covering
    those blocks are the same, so every block a feature overlaps carries the
    feature's identifier and its offset relative to the block in its hash.

    Attributes:
        identifier: Content hash of the input (equal content, equal id).
        offset: Index of the input's first placeholder token in the prompt.
        length: Number of placeholder tokens the input occupies.
    """

    identifier: str
    offset: int = attrs.field(validator=attrs.validators.ge(0))
    length: int = attrs.field(validator=attrs.validators.gt(0))


class Request:
    """One generation request, as the KV cache manager sees it.

    The engine owns the request: it appends output tokens and advances
    :attr:`num_computed_tokens` after each step. kvcore owns
    :attr:`block_hashes`, which it extends lazily (one hash per full block of
    ``hash_block_size`` tokens) whenever the manager is asked about the
    request; a request therefore belongs to one ``KVCacheManager``.

    Args:
        request_id: Unique id; block tables are keyed by it.
        prompt_token_ids: The prompt's token ids.
        lora_name: Name of the LoRA adapter, if any. Requests with different
            adapters never share cached blocks.
        lora_id: Integer id of the LoRA adapter (reported in events).
        cache_salt: Tenant isolation: requests with different salts never
            share cached blocks. Enters the hash of the first block only (the
            hash chain carries it to the others).
        mm_features: Multimodal inputs in the prompt, sorted by offset.
        skip_reading_prefix_cache: Never *read* the prefix cache for this
            request (e.g. it needs prompt log-probabilities, which a cache hit
            would not compute). Its blocks are still cached for others.
        prompt_embeds: Prompt embeddings given instead of (or with
            placeholder) token ids: a numpy array or a torch tensor with one
            row per prompt token. Every block's hash then covers the bytes of
            its rows (with their dtype and row shape), so two prompts share
            cached blocks only where their embeddings are equal.

    Token ids are integers that fit a signed 64-bit integer (``bool`` and
    numpy integers count as their integer value). They are checked when they
    are hashed, that is when the manager first looks at a completed block: a
    bad id is refused there, before anything changes, with its position.

    Raises:
        InvalidRequestError: an empty prompt, a request id that is not a
            string, unsorted ``mm_features``, or ``prompt_embeds`` without one
            row per prompt token.
    """

    __slots__ = (
        "_all_token_ids",
        "_hash_key",
        "_kv_cache_at",
        "_kv_owner",
        "_kv_slots",
        "block_hashes",
        "cache_salt",
        "lora_id",
        "lora_name",
        "mm_features",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "prompt_embeds",
        "request_id",
        "skip_reading_prefix_cache",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        lora_name: str | None = None,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[MultiModalFeature] = (),
        skip_reading_prefix_cache: bool = False,
        prompt_embeds: Any = None,
    ) -> None:
        if not isinstance(request_id, str):
            msg = f"request_id must be a string, got {request_id!r}"
            raise InvalidRequestError(msg)
        if not len(prompt_token_ids):
            msg = f"request {request_id!r}: prompt_token_ids is empty; a prompt needs >= 1 token"
            raise InvalidRequestError(msg)
        offsets = [feature.offset for feature in mm_features]
        if offsets != sorted(offsets):
            msg = f"request {request_id!r}: mm_features must be sorted by offset"
            raise InvalidRequestError(msg)
        self.request_id = request_id
        self._all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self._all_token_ids)
        if prompt_embeds is not None and len(prompt_embeds) != self.num_prompt_tokens:
            msg = (
                f"request {request_id!r}: prompt_embeds has {len(prompt_embeds)} rows for "
                f"{self.num_prompt_tokens} prompt tokens; give one row per prompt token"
            )
            raise InvalidRequestError(msg)
        #: The prompt embeddings (one row per prompt token), or ``None``.
        self.prompt_embeds = prompt_embeds
        self.lora_name = lora_name
        self.lora_id = lora_id
        self.cache_salt = cache_salt
        self.mm_features: tuple[MultiModalFeature, ...] = tuple(mm_features)
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        #: Tokens whose KV the engine has computed (maintained by the engine).
        self.num_computed_tokens = 0
        #: How many times the engine preempted this request.
        self.num_preemptions = 0
        #: Chained hashes of the full hash-size blocks (maintained by kvcore).
        self.block_hashes: list[Hashable] = []
        self._hash_key: object = None
        # The KVCacheManager holding this request's blocks (set by a successful
        # allocate_slots, cleared by free), or None.
        self._kv_owner: object = None
        # The decode fast path of the owner (see KVCacheManager.allocate_slots):
        # slots the request has in every decoder group, and the token count at
        # which its next block gets cached. 0 sends every call the full way.
        self._kv_slots = 0
        self._kv_cache_at = 0

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt's token ids (a copy)."""
        return self._all_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        """The generated token ids so far (a copy)."""
        return self._all_token_ids[self.num_prompt_tokens :]

    @property
    def all_token_ids(self) -> list[int]:
        """The prompt's then the output's token ids (the live list, not a copy)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self._all_token_ids)

    @property
    def needs_extra_hash_keys(self) -> bool:
        """Whether block hashes carry more than the token ids (LoRA, salt, media)."""
        return bool(
            self.lora_name or self.cache_salt or self.mm_features or self.prompt_embeds is not None
        )

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append one generated token id, or several in order.

        The ids are checked when their block is hashed (see the class).

        Raises:
            InvalidRequestError: ``token_ids`` is neither an integer nor an
                iterable.
        """
        if token_ids.__class__ is int:
            self._all_token_ids.append(token_ids)
        elif isinstance(token_ids, Iterable) and not isinstance(token_ids, str | bytes):
            self._all_token_ids.extend(token_ids)
        elif hasattr(token_ids, "__index__"):
            self._all_token_ids.append(token_ids)  # type: ignore[arg-type]
        else:
            msg = (
                f"request {self.request_id!r}: token_ids must be an integer or an iterable "
                f"of integers, got {token_ids!r}"
            )
            raise InvalidRequestError(msg)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
