"""Names: the core names no attention type, and every type has one name everywhere."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import kvcore

REPO = Path(__file__).resolve().parents[1]

#: Words that name an attention type, a type-specific config field or a model
#: family whose layout used to be hard-coded, besides the registry's own names.
WELL_KNOWN = (
    "full_attention",
    "sliding",
    "chunked_local",
    "chunked_attention",
    "mamba",
    "linear_attention",
    "gated_delta",
    "cross_attention",
    "encoder_attn",
    "sink",
    "mla",
    "latent",
    "kv_lora_rank",
    "hidden_state",
    "attention_chunk_size",
    "attn_layer_period",
    "full_attention_interval",
    "jamba",
    "qwen",
    "llama",
    "gemma",
    "deepseek",
    "whisper",
    "mistral",
)


def attention_type_words() -> set[str]:
    registry = kvcore.load_registry(environ={})
    words = set(WELL_KNOWN)
    words.update(plugin.name for plugin in registry.plugins)
    words.update(layer_type.spec.kind for layer_type in registry.layer_types)
    words.update(registry.claims("kvcore_layer_kinds"))
    return {word.lower() for word in words}


def docstring_lines(source: str) -> set[int]:
    """Lines of every docstring (module, class, function) and ``#:`` attribute comment."""
    lines: set[int] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body:
            continue
        first = body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_words(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every name, string and comment outside docstrings."""
    source = path.read_text()
    skip = docstring_lines(source)
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT):
            continue
        if token.type == tokenize.COMMENT and token.string.startswith("#:"):
            continue  # attribute documentation, rendered by autodoc
        if token.type == tokenize.STRING and token.start[0] in skip:
            continue
        found.append((token.start[0], token.string))
    return found


# Integrations sit on top of the core and speak their library's language: the
# layer types of a transformers config ("sliding_attention"), its cross-attention
# modules. The core below them names no type.
INTEGRATIONS = REPO / "kvcore" / "integrations"

# Names the core must spell, each with its reason.
ALLOWED = {
    # The contract check refusing a spec class that still defines the hook
    # plugin contract v1 removed (it would silently never be called).
    ("kvcore/_contract.py", "as_full_attention"),
    # A field of vLLM's KV event wire format, which kvcore fills at vLLM's position.
    ("kvcore/cluster/_wire.py", "kv_cache_spec_sliding_window"),
}

# Names the core may spell in any file: the plan option whose name users know
# (how often groups of recurrent states keep one, ``--mamba-checkpoint``). Planning
# finds those groups through the spec protocol (a page that does not follow the
# block size), never by type.
ALLOWED_EVERYWHERE = {"mamba_checkpoint"}


#: Files that translate another engine's attention types into kvcore's kinds and
#: so must spell both (kvcore's classes are still found through the registry).
TRANSLATORS = {"kvcore/integrations/vllm/_convert.py"}


def test_the_core_names_no_attention_type_outside_docstrings():
    words = attention_type_words()
    # Type names spelt with spaces or hyphens count too ("full attention", "sliding-window").
    pattern = re.compile("|".join(sorted(map(re.escape, words), key=len, reverse=True)))
    hits = []
    for path in sorted((REPO / "kvcore").rglob("*.py")):
        if INTEGRATIONS in path.parents:
            continue
        for line, text in code_words(path):
            normal = re.sub(r"[\s\-]+", "_", text.lower())
            match = pattern.search(normal)
            relative = str(path.relative_to(REPO))
            if relative in TRANSLATORS:
                continue
            if any(relative == f and name in normal for f, name in ALLOWED):
                continue
            for name in ALLOWED_EVERYWHERE:
                normal = normal.replace(name, "")
            match = pattern.search(normal)
            if match:
                hits.append(f"{path.relative_to(REPO)}:{line}: {match.group()!r} in {text!r}")
    assert hits == []


def test_the_word_list_catches_what_it_should():
    """The check above would fail on the lines the core used to hold."""
    words = attention_type_words()
    pattern = re.compile("|".join(sorted(map(re.escape, words), key=len, reverse=True)))
    for old_line in (
        'kinds = ["full_attention" if i % period == offset else "mamba" for i in range(count)]',
        '_LAYER_SUFFIX = {"mamba": "mamba", "linear_attention": "linear_attn"}',
        "mamba_cache_mode: str = 'align'",
        "def as_full_attention(self, block_size: int):",
        'help="allocate sliding-window and chunked layers as full attention"',
    ):
        assert pattern.search(re.sub(r"[\s\-]+", "_", old_line.lower())), old_line


BUILTIN = (
    "full_attention",
    "sliding_window",
    "chunked_local",
    "mamba",
    "cross_attention",
    "sink_full_attention",
    "mla",
    "hidden_state",
    "nvfp4_attention",
)


@pytest.mark.parametrize("name", BUILTIN)
def test_one_name_per_type_plugin_kind_layer_kind_and_events(name):
    registry = kvcore.load_registry(only=BUILTIN)
    (plugin,) = [p for p in registry.plugins if p.name == name]
    (layer_type,) = plugin.layer_types
    assert layer_type.spec.kind == name
    assert plugin.layer_kinds[0].name == name
    claim = registry.layer_kind(name)
    assert claim is not None
    assert claim.plugin.name == name


def test_events_carry_the_kind():
    from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
    from kvcore_plugins.mla import MLAAttentionSpec

    chunked = ChunkedLocalAttentionSpec(
        block_size=4, num_kv_heads=1, head_size=2, dtype="float32", attention_chunk_size=8
    )
    mla = MLAAttentionSpec(block_size=4, head_size=8, dtype="float32")
    manager = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(20, [mla, chunked]),
        64,
        registry=kvcore.load_registry(only=BUILTIN),
        enable_kv_cache_events=True,
    )
    request = kvcore.Request("r", list(range(8)))
    manager.allocate_slots(request, 8)
    request.num_computed_tokens = 8
    manager.allocate_slots(request, 1)  # caches the two full blocks of each group
    kinds = {
        event.kind
        for event in manager.take_events()
        if isinstance(event, kvcore.events.BlockStored)
    }
    assert kinds == {"mla", "chunked_local"}
