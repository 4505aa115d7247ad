"""Tiny transformers models built from configs with seeded random weights (nothing downloaded).

One per attention type transformers implements: 2 decoder layers, hidden
size 32, float64, eager attention and eager experts (the grouped-matmul
experts take no float64). The validation tests and the benchmark run them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers

__all__ = ["TINY_MODELS", "tiny_model"]

#: Vocabulary of every tiny model.
VOCAB = 128
_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "head_dim": 8,
}
#: The window and the chunk of the local layers, in tokens.
WINDOW = 8
CHUNK = 16


def _llama() -> Any:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**_COMMON))


def _mistral() -> Any:
    config = transformers.MistralConfig(**_COMMON, sliding_window=WINDOW)
    return transformers.MistralForCausalLM(config)


def _gemma3() -> Any:
    config = transformers.Gemma3TextConfig(
        **_COMMON, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]
    )
    return transformers.Gemma3ForCausalLM(config)


def _gpt_oss() -> Any:
    config = transformers.GptOssConfig(
        **{**_COMMON, "intermediate_size": 32},
        sliding_window=WINDOW,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
    )
    return transformers.GptOssForCausalLM(config)


def _llama4() -> Any:
    config = transformers.Llama4TextConfig(
        **_COMMON,
        intermediate_size_mlp=64,
        attention_chunk_size=CHUNK,
        num_local_experts=2,
        layer_types=["chunked_attention", "full_attention"],
        no_rope_layers=[1, 0],
    )
    return transformers.Llama4ForCausalLM(config)


def _qwen3_next() -> Any:
    config = transformers.Qwen3NextConfig(
        **_COMMON,
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )
    return transformers.Qwen3NextForCausalLM(config)


def _deepseek_v3() -> Any:
    config = transformers.DeepseekV3Config(
        **{**_COMMON, "num_key_value_heads": 4},
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    )
    return transformers.DeepseekV3ForCausalLM(config)


def _whisper() -> Any:
    config = transformers.WhisperConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=8,
        max_source_positions=16,
        max_target_positions=64,
        pad_token_id=0,
        decoder_start_token_id=1,
        eos_token_id=2,
        bos_token_id=1,
    )
    return transformers.WhisperForConditionalGeneration(config)


#: Name → (builder, the attention types of its cache).
TINY_MODELS: dict[str, tuple[Callable[[], Any], str]] = {
    "llama": (_llama, "full attention"),
    "mistral": (_mistral, "sliding window"),
    "gemma3": (_gemma3, "sliding window + full attention"),
    "gpt-oss": (_gpt_oss, "sliding window (sinks, experts) + full attention"),
    "llama4": (_llama4, "chunked local + full attention"),
    "qwen3-next": (_qwen3_next, "linear attention (Mamba group: conv + recurrent) + full"),
    "deepseek-v3": (_deepseek_v3, "MLA (the latent cached)"),
    "whisper": (_whisper, "full self-attention + cross attention"),
}


def tiny_model(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float64) -> Any:
    """The tiny model ``name`` (a key of :data:`TINY_MODELS`), weights from ``seed``, in eval mode.

    Raises:
        KeyError: no tiny model has that name.
    """
    builder, _ = TINY_MODELS[name]
    torch.manual_seed(seed)
    model = builder()
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    return model.to(dtype).eval()
