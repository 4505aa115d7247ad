"""A tiny model built from a plan: one layer per cache layer, random weights from a seed."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping, Sequence

import attrs
import torch

from kvcore._exec.kernels import kernel_for, reference_kernels
from kvcore._planning.plan import KVCachePlan
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore.errors import InvalidConfigError
from kvcore.reference import COMPUTE_DTYPE, ReferenceKernel
from kvcore.specs import KVCacheSpec

__all__ = ["ReferenceLayer", "ReferenceModel"]

#: Width of the tiny model's hidden state when none is given.
DEFAULT_HIDDEN_SIZE = 32
#: Rows of the embedding table; a token id ``i`` uses row ``i mod vocab_size``.
DEFAULT_VOCAB_SIZE = 256


@attrs.frozen(kw_only=True)
class ReferenceLayer:
    """One layer of the model: what the model config says it computes.

    Attributes:
        name: The cache layer's name in the plan.
        spec: Its spec as built from the model config, before planning
            changed block sizes, pages, or allocated it as another type:
            the dense oracle computes with this one.
        kernel: The reference kernel of ``spec``.
        params: Its weights.
    """

    name: str
    spec: KVCacheSpec
    kernel: ReferenceKernel = attrs.field(eq=False)
    params: Mapping[str, torch.Tensor] = attrs.field(eq=False, repr=False)


def _check_positive(name: str, value: object) -> None:
    if type(value) is not int or value < 1:
        msg = f"{name} must be a positive integer, got {value!r}"
        raise InvalidConfigError(msg)


@attrs.frozen(kw_only=True)
class ReferenceModel:
    """A residual stack of the plan's cache layers over a token embedding.

    The hidden state of position ``t`` starts as the embedding of its token;
    each layer adds its output: ``h ← h + layer(h)``. Layers run in the order
    of the model config. The model's output at a position is the hidden
    state after every layer. Encoder-decoder requests also have an *encoder
    output*, random per request (seeded by the model's seed and the request
    id), which cross-attention layers read.

    Build it with :meth:`from_plan` (or :meth:`from_specs`).

    Attributes:
        layers: The layers, in model order.
        embedding: ``(vocab_size, hidden_size)`` float64.
        seed: The seed the weights and encoder outputs derive from.
    """

    layers: tuple[ReferenceLayer, ...]
    embedding: torch.Tensor = attrs.field(eq=False, repr=False)
    seed: int

    @property
    def hidden_size(self) -> int:
        """Width of the hidden state."""
        return int(self.embedding.shape[1])

    @classmethod
    def from_plan(
        cls,
        plan: KVCachePlan,
        *,
        registry: Registry | None = None,
        kernels: Mapping[type[KVCacheSpec], ReferenceKernel] | None = None,
        hidden_size: int = DEFAULT_HIDDEN_SIZE,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> ReferenceModel:
        """The model of a plan's layers (``plan.layer_specs``); see :meth:`from_specs`."""
        return cls.from_specs(
            plan.layer_specs,
            registry=registry,
            kernels=kernels,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            seed=seed,
            device=device,
        )

    @classmethod
    def from_specs(
        cls,
        layer_specs: Mapping[str, KVCacheSpec],
        *,
        registry: Registry | None = None,
        kernels: Mapping[type[KVCacheSpec], ReferenceKernel] | None = None,
        hidden_size: int = DEFAULT_HIDDEN_SIZE,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> ReferenceModel:
        """The model of ``layer_specs``, with weights drawn from ``seed``.

        Args:
            layer_specs: Layer name → spec, in model order, as the model
                config builds them (before planning changes block sizes or
                pages): they say what each layer computes.
            registry: The plugins providing kernels (default: every
                installed plugin).
            kernels: Spec class → kernel (default: collected from
                ``registry`` through the ``kvcore_reference_kernels`` hook).
            hidden_size: Width of the hidden state.
            vocab_size: Rows of the embedding table.
            seed: Seed of every weight (layer ``i`` draws from its own
                generator, seeded with ``seed`` and ``i``).
            device: Where the weights live.

        Raises:
            UnknownSpecError: a layer's spec has no reference kernel.
            InvalidConfigError: a non-positive size.
        """
        _check_positive("hidden_size", hidden_size)
        _check_positive("vocab_size", vocab_size)
        registry = load_registry() if registry is None else registry
        if kernels is None:
            kernels = reference_kernels(registry)
        layers = []
        for index, (name, spec) in enumerate(layer_specs.items()):
            kernel = kernel_for(kernels, spec, registry, name)
            generator = torch.Generator().manual_seed(_mix(seed, index + 1))
            params = {
                key: value.to(device)
                for key, value in kernel.init_params(spec, hidden_size, generator).items()
            }
            layers.append(ReferenceLayer(name=name, spec=spec, kernel=kernel, params=params))
        generator = torch.Generator().manual_seed(_mix(seed, 0))
        embedding = torch.randn(vocab_size, hidden_size, generator=generator, dtype=COMPUTE_DTYPE)
        return cls(layers=tuple(layers), embedding=embedding.to(device), seed=seed)

    def embed(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The embeddings of ``token_ids``, ``(len(token_ids), hidden_size)``."""
        rows = [token % len(self.embedding) for token in token_ids]
        return self.embedding[torch.tensor(rows, dtype=torch.long, device=self.embedding.device)]

    def encoder_states(self, request_id: str, num_encoder_tokens: int) -> torch.Tensor | None:
        """The encoder output of a request, ``(num_encoder_tokens, hidden_size)``; ``None`` for 0.

        A pure function of the seed, the request id and the count, so the
        paged and the dense run see the same one.
        """
        if num_encoder_tokens <= 0:
            return None
        key = _mix(self.seed, zlib.crc32(request_id.encode()) + num_encoder_tokens)
        generator = torch.Generator().manual_seed(key)
        states = torch.randn(
            num_encoder_tokens, self.hidden_size, generator=generator, dtype=COMPUTE_DTYPE
        )
        return states.to(self.embedding.device)


def _mix(seed: int, value: int) -> int:
    """A 56-bit seed from two integers (stable across runs, unlike ``hash``)."""
    digest = hashlib.blake2b(f"{seed}:{value}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")
