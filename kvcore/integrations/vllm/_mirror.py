"""kvcore's copy of every vLLM request the manager is asked about.

kvcore's :class:`~kvcore.KVCacheManager` takes its own :class:`kvcore.Request`;
vLLM's scheduler hands over ``vllm.v1.request.Request`` objects. The mirror
keeps one kvcore request per vLLM request and brings it up to date before
every manager call that reads it.

What kvcore reads from a vLLM request, and when:

* when the copy is made (the first call naming the request): ``request_id``,
  ``all_token_ids`` (the prompt, ``num_prompt_tokens`` long, and any output
  already there), ``lora_request`` (``name``, ``adapter_id``), ``cache_salt``,
  ``mm_features`` (``identifier``, ``mm_position.offset`` and ``.length``),
  ``skip_reading_prefix_cache`` and ``prompt_embeds``: they never change
  while a request lives;
* before every call taking the request (``get_computed_blocks``,
  ``allocate_slots``, ``cache_blocks``, ``free``) and before
  ``remove_skipped_blocks`` of its id: the tokens appended since the last
  call (vLLM 0.14 only appends), ``num_computed_tokens`` and
  ``num_preemptions``.

The copy also holds kvcore's block hashes of the request, so it lives as long
as the vLLM request: through preemptions (a resumed request's hashes are
still valid), until a *finished* request is freed.
"""

from __future__ import annotations

from typing import Any

from kvcore._request import MultiModalFeature, Request
from kvcore.errors import InvalidRequestError, RequestStateError

__all__ = ["RequestMirror"]


def copy_of(request: Any) -> Request:
    """A new kvcore request with the vLLM request's tokens and hash inputs."""
    tokens = request.all_token_ids
    num_prompt = request.num_prompt_tokens
    lora = request.lora_request
    features = sorted(
        (
            MultiModalFeature(
                identifier=feature.identifier,
                offset=feature.mm_position.offset,
                length=feature.mm_position.length,
            )
            for feature in request.mm_features
        ),
        key=lambda feature: feature.offset,
    )
    copy = Request(
        request.request_id,
        tokens[:num_prompt],
        lora_name=lora.name if lora is not None else None,
        lora_id=lora.adapter_id if lora is not None else None,
        cache_salt=request.cache_salt,
        mm_features=features,
        skip_reading_prefix_cache=request.skip_reading_prefix_cache,
        prompt_embeds=request.prompt_embeds,
    )
    if len(tokens) > num_prompt:
        copy.append_output_token_ids(tokens[num_prompt:])
    return copy


class RequestMirror:
    """One kvcore request per live vLLM request, by request id.

    Args:
        holds_blocks: Whether the manager's request of an id holds blocks;
            a vLLM request reusing the id of one that does is refused.
    """

    __slots__ = ("_entries", "_holds_blocks")

    def __init__(self, holds_blocks: Any) -> None:
        self._entries: dict[str, tuple[Any, Request]] = {}
        self._holds_blocks = holds_blocks

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def sync(self, request: Any) -> Request:
        """The up-to-date kvcore copy of ``request`` (made on first sight).

        Raises:
            RequestStateError: another vLLM request object with this id has a
                copy holding blocks.
            InvalidRequestError: the vLLM request has fewer tokens than its
                copy (vLLM 0.14 never removes tokens).
        """
        entry = self._entries.get(request.request_id)
        if entry is not None and entry[0] is request:
            copy = entry[1]
            have, want = copy.num_tokens, request.num_tokens
            if want != have:
                if want < have:
                    raise _shrunk(request, have)
                copy.append_output_token_ids(request.all_token_ids[have:])
        else:
            if entry is not None and self._holds_blocks(request.request_id):
                msg = (
                    f"request {request.request_id!r}: another vLLM Request object with this "
                    "id holds KV cache blocks; request ids must be unique among live requests"
                )
                raise RequestStateError(msg)
            copy = copy_of(request)
            self._entries[request.request_id] = (request, copy)
        copy.num_computed_tokens = request.num_computed_tokens
        copy.num_preemptions = request.num_preemptions
        return copy

    def sync_id(self, request_id: str) -> Request | None:
        """The up-to-date copy of the request with this id, or ``None`` if none was made."""
        entry = self._entries.get(request_id)
        return None if entry is None else self.sync(entry[0])

    def get(self, request_id: str) -> Request | None:
        """The copy of the request with this id as it stands, or ``None`` if none was made."""
        entry = self._entries.get(request_id)
        return None if entry is None else entry[1]

    def drop(self, request_id: str) -> None:
        """Forget the copy of a finished request (a no-op if there is none)."""
        self._entries.pop(request_id, None)


def _shrunk(request: Any, had: int) -> InvalidRequestError:
    msg = (
        f"request {request.request_id!r} has {request.num_tokens} tokens, fewer than the "
        f"{had} kvcore has seen; the vLLM releases kvcore supports only append tokens"
    )
    return InvalidRequestError(msg)
