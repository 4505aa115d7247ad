"""The reference kernels: strict slot addressing, real attention and recurrence, the hook."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kvcore
from kvcore import KVCacheGroupSpec
from kvcore.errors import HookImplementationError, PluginConflictError, UnknownSpecError
from kvcore.executor import (
    EngineRequest,
    Executor,
    ReferenceEngine,
    ReferenceModel,
    reference_kernels,
)
from kvcore.reference import CacheLayer, PagedAccessError, StepInput, attend
from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
from kvcore_plugins.cross_attention import CrossAttentionSpec
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.hidden_state import HiddenStateCacheSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.mla import MLAAttentionSpec
from kvcore_plugins.sink_full_attention import SinkFullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

F64 = torch.float64


def cache_layer(spec, num_blocks=8):
    views = tuple(
        torch.full((num_blocks, *part.shape), float("nan"), dtype=getattr(torch, part.dtype))
        for part in spec.page_parts()
    )
    return CacheLayer(name="layer", spec=spec, views=views, group_id=0, manager=None)


def full_spec(block_size=4, heads=1, head_size=2, **extra):
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype="float64", **extra
    )


# -- strict addressing ---------------------------------------------------------------


def test_positions_map_to_slots_through_the_table():
    layer = cache_layer(full_spec())  # rows of (1 head, 2 + 2)
    rows = torch.arange(5 * 4, dtype=F64).reshape(5, 1, 4)
    layer.write((3, 5), 2, rows, who="r")  # positions 2..6
    view = layer.views[0]
    # Positions 2, 3 are slots 2, 3 of block 3; positions 4, 5, 6 slots 0-2 of block 5.
    assert torch.equal(view[3, 2:4], rows[0:2])
    assert torch.equal(view[5, 0:3], rows[2:5])
    assert torch.isnan(view[3, 0:2]).all()
    assert torch.isnan(view[5, 3]).all()
    assert torch.equal(layer.read((3, 5), 3, 6, who="r"), rows[1:4])


def test_reading_through_the_null_block_is_an_error():
    layer = cache_layer(full_spec())
    with pytest.raises(PagedAccessError, match=r"request 'a': position 1 is in the null block"):
        layer.read((0, 5), 1, 6, who="request 'a'")


def test_reading_past_the_table_is_an_error():
    layer = cache_layer(full_spec())
    with pytest.raises(
        PagedAccessError, match=r"position 8 is in block 2 of its block table, which has 2 entries"
    ):
        layer.read((3, 5), 4, 9, who="r")


def test_writing_through_the_null_block_is_an_error_and_writes_nothing_there():
    layer = cache_layer(full_spec())
    with pytest.raises(PagedAccessError, match="null block"):
        layer.write((0,), 0, torch.zeros(1, 1, 4, dtype=F64), who="r")
    assert torch.isnan(layer.views[0][0]).all()


def test_a_block_id_outside_the_pool_is_an_error():
    layer = cache_layer(full_spec(), num_blocks=8)
    with pytest.raises(PagedAccessError, match="outside the pool's 8 blocks"):
        layer.read((8,), 0, 1, who="r")


def test_reads_are_copies():
    layer = cache_layer(full_spec())
    layer.write((2,), 0, torch.ones(4, 1, 4, dtype=F64), who="r")
    got = layer.read((2,), 0, 4, who="r")
    layer.write((2,), 0, torch.zeros(4, 1, 4, dtype=F64), who="r")
    assert torch.equal(got, torch.ones(4, 1, 4, dtype=F64))


# -- the kernels compute what their type computes -------------------------------------


def sdpa(query, keys, values, allowed):
    """Attention of every position written independently: masks and matmuls."""
    scores = torch.einsum("thd,shd->hts", query, keys) / query.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), values)


def test_attend_is_scaled_dot_product_attention():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 3, generator=gen, dtype=F64)
    k = torch.randn(5, 2, 3, generator=gen, dtype=F64)
    v = torch.randn(5, 2, 4, generator=gen, dtype=F64)
    expected = sdpa(q, k, v, torch.ones(1, 5, dtype=torch.bool))[0]
    assert torch.allclose(attend(q[0], k, v), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        (full_spec(), lambda t, s: s <= t),
        (
            SlidingWindowSpec(
                block_size=4, num_kv_heads=1, head_size=2, dtype="float64", sliding_window=3
            ),
            lambda t, s: (s <= t) & (s > t - 3),
        ),
        (
            ChunkedLocalAttentionSpec(
                block_size=4, num_kv_heads=1, head_size=2, dtype="float64", attention_chunk_size=4
            ),
            lambda t, s: (s <= t) & (s // 4 == t // 4),
        ),
        (
            full_spec(
                compute_spec=SlidingWindowSpec(
                    block_size=4, num_kv_heads=1, head_size=2, dtype="float64", sliding_window=3
                )
            ),
            lambda t, s: (s <= t) & (s > t - 3),
        ),
    ],
    ids=["full", "sliding", "chunked", "full-recording-a-window"],
)
def test_attention_kernels_attend_over_what_their_type_sees(spec, allowed):
    registry = kvcore.load_registry()
    kernel = reference_kernels(registry)[type(spec)]
    gen = torch.Generator().manual_seed(2)
    params = kernel.init_params(spec, 8, gen)
    x = torch.randn(10, 8, generator=gen, dtype=F64)
    got = kernel.dense(spec, params, x, None)
    # The same layer written with whole-sequence matrix products and a mask.
    q = (x @ params["wq"]).reshape(10, 1, 2)
    kv = (x @ params["wkv"]).reshape(10, 1, 4)
    t, s = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    out = sdpa(q, kv[..., :2], kv[..., 2:], allowed(t, s)[None])
    expected = out.reshape(10, 2) @ params["wo"]
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def test_sink_cross_mla_and_hidden_state_kernels_against_matrix_products():
    registry = kvcore.load_registry()
    kernels = reference_kernels(registry)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(7, 8, generator=gen, dtype=F64)
    t, s = torch.meshgrid(torch.arange(7), torch.arange(7), indexing="ij")
    causal = (s <= t)[None]

    sink = SinkFullAttentionSpec(
        block_size=4, num_kv_heads=1, head_size=2, dtype="float64", sink_len=4
    )
    params = kernels[SinkFullAttentionSpec].init_params(sink, 8, gen)
    q = (x @ params["wq"]).reshape(7, 1, 2)
    kv = torch.cat([params["sink"], (x @ params["wkv"]).reshape(7, 1, 4)])
    allowed = torch.cat([torch.ones(1, 7, 4, dtype=torch.bool), causal], dim=-1)
    expected = sdpa(q, kv[..., :2], kv[..., 2:], allowed).reshape(7, 2) @ params["wo"]
    got = kernels[SinkFullAttentionSpec].dense(sink, params, x, None)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)

    cross = CrossAttentionSpec(block_size=4, num_kv_heads=1, head_size=2, dtype="float64")
    params = kernels[CrossAttentionSpec].init_params(cross, 8, gen)
    encoder = torch.randn(5, 8, generator=gen, dtype=F64)
    q = (x @ params["wq"]).reshape(7, 1, 2)
    kv = (encoder @ params["wkv"]).reshape(5, 1, 4)
    everything = torch.ones(1, 7, 5, dtype=torch.bool)
    expected = sdpa(q, kv[..., :2], kv[..., 2:], everything).reshape(7, 2) @ params["wo"]
    got = kernels[CrossAttentionSpec].dense(cross, params, x, encoder)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)

    mla = MLAAttentionSpec(block_size=4, head_size=3, dtype="float64")
    params = kernels[MLAAttentionSpec].init_params(mla, 8, gen)
    latents = (x @ params["wkv"]).reshape(7, 1, 3).expand(7, 2, 3)  # two query heads
    q = (x @ params["wq"]).reshape(7, 2, 3)
    expected = sdpa(q, latents, latents, causal).reshape(7, 6) @ params["wo"]
    got = kernels[MLAAttentionSpec].dense(mla, params, x, None)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)

    hidden = HiddenStateCacheSpec(block_size=4, num_kv_heads=2, head_size=3, dtype="float64")
    params = kernels[HiddenStateCacheSpec].init_params(hidden, 8, gen)
    stored = (x @ params["wh"]).reshape(7, 2, 3)
    q = (x @ params["wq"]).reshape(7, 2, 3)
    expected = sdpa(q, stored, stored, causal).reshape(7, 6) @ params["wo"]
    got = kernels[HiddenStateCacheSpec].dense(hidden, params, x, None)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def test_the_paged_attention_path_equals_the_dense_one_bit_for_bit():
    spec = SlidingWindowSpec(
        block_size=4, num_kv_heads=2, head_size=3, dtype="float64", sliding_window=5
    )
    kernel = reference_kernels(kvcore.load_registry())[SlidingWindowSpec]
    gen = torch.Generator().manual_seed(3)
    params = kernel.init_params(spec, 8, gen)
    x = torch.randn(11, 8, generator=gen, dtype=F64)
    layer = cache_layer(spec)
    table = (6, 2, 7)
    outputs = []
    for start, stop in ((0, 6), (6, 7), (7, 11)):  # a prefill chunk, a decode, a chunk
        step = StepInput(request_id="r", start=start, x=x[start:stop], block_table=table)
        carry = kernel.begin(spec, params, layer, step)
        outputs.append(kernel.finish(spec, params, layer, step, carry))
    assert torch.equal(torch.cat(outputs), kernel.dense(spec, params, x, None))
    # From position 7 on, the window no longer reaches block 0 (positions 0-3).
    late = StepInput(request_id="r", start=9, x=x[9:11], block_table=(0, 2, 7))
    kernel.begin(spec, params, layer, late)
    kernel.finish(spec, params, layer, late, None)
    early = StepInput(request_id="r", start=7, x=x[7:8], block_table=(0, 2, 7))
    with pytest.raises(PagedAccessError, match="position 3"):
        kernel.finish(spec, params, layer, early, None)


def mamba_spec():
    return MambaSpec(
        block_size=4,
        shapes=((2, 3), (2, 2)),
        dtypes=("float64", "float64"),
        mamba_cache_mode="align",
    )


def test_mamba_checkpoints_land_at_block_boundaries_and_resume_exactly():
    spec = mamba_spec()
    kernel = reference_kernels(kvcore.load_registry())[MambaSpec]
    gen = torch.Generator().manual_seed(4)
    params = kernel.init_params(spec, 8, gen)
    x = torch.randn(13, 8, generator=gen, dtype=F64)
    dense = kernel.dense(spec, params, x, None)
    layer = cache_layer(spec)
    # One prefill of 10 tokens: the states after 4 and 8 tokens go to entries 0
    # and 1 of the table (blocks 5 and 2), the state after 10 to entry 2 (block 6).
    step = StepInput(request_id="a", start=0, x=x[:10], block_table=(5, 2, 6))
    out = kernel.finish(spec, params, layer, step, kernel.begin(spec, params, layer, step))
    assert torch.equal(out, dense[:10])
    for block in (5, 2, 6):
        assert not torch.isnan(layer.views[1][block]).any()
    assert torch.isnan(layer.views[1][1]).all()
    # A second request hits the state after 8 tokens ([null, block 2]) and resumes.
    hit = StepInput(request_id="b", start=8, x=x[8:13], block_table=(0, 2, 3, 4))
    out = kernel.finish(spec, params, layer, hit, kernel.begin(spec, params, layer, hit))
    assert torch.equal(out, dense[8:13])
    # The state after 8 tokens freed: reading it is an error, not zeros.
    freed = StepInput(request_id="c", start=8, x=x[8:9], block_table=(0, 0, 3))
    with pytest.raises(PagedAccessError, match="position 7 is in the null block"):
        kernel.begin(spec, params, layer, freed)


def test_mamba_recurrence_by_hand_for_two_tokens():
    spec = mamba_spec()
    kernel = reference_kernels(kvcore.load_registry())[MambaSpec]
    params = kernel.init_params(spec, 8, torch.Generator().manual_seed(5))
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(6), dtype=F64)
    window, state, outs = torch.zeros(2, 3, dtype=F64), torch.zeros(4, dtype=F64), []
    for xt in x:
        taps = torch.cat([window, (xt @ params["w_in"])[None]])
        y = torch.tanh((taps * params["conv"]).sum(0))
        state = torch.sigmoid(y @ params["w_a"]) * state + y @ params["w_b"]
        window = taps[1:]
        outs.append((state * (y @ params["w_c"])) @ params["w_o"])
    got = kernel.dense(spec, params, x, None)
    assert torch.allclose(got, torch.stack(outs), rtol=0, atol=1e-12)


def test_cross_attention_without_encoder_output_is_an_error():
    spec = CrossAttentionSpec(block_size=4, num_kv_heads=1, head_size=2, dtype="float64")
    kernel = reference_kernels(kvcore.load_registry())[CrossAttentionSpec]
    params = kernel.init_params(spec, 8, torch.Generator().manual_seed(7))
    step = StepInput(request_id="r", start=0, x=torch.zeros(1, 8, dtype=F64), block_table=(1,))
    with pytest.raises(PagedAccessError, match="no encoder output"):
        kernel.begin(spec, params, cache_layer(spec), step)


# -- the hook -------------------------------------------------------------------------


def test_every_built_in_type_has_a_reference_kernel():
    registry = kvcore.load_registry()
    kernels = reference_kernels(registry)
    built_in = {
        layer_type.spec
        for plugin in registry.plugins
        if plugin.module.startswith("kvcore_plugins.")
        for layer_type in plugin.layer_types
    }
    assert len(built_in) == 9
    assert built_in <= set(kernels)
    assert all(cls.__module__.startswith("kvcore_plugins.") for cls in kernels)


def test_loading_plugins_does_not_import_torch():
    code = "import sys, kvcore; kvcore.load_registry(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def with_plugin(name, attribute):
    """The installed plugins plus ``kernel_plugins.<attribute>``, passed in by name."""
    import kernel_plugins

    return kvcore.load_registry(plugins={name: getattr(kernel_plugins, attribute)}, environ={})


def test_two_kernels_for_one_spec_class_conflict():
    registry = with_plugin("dup", "Duplicate")
    with pytest.raises(
        PluginConflictError,
        match=r"FullAttentionSpec is claimed by plugin 'dup' and by plugin "
        r"'full_attention' \(both through kvcore_reference_kernels\)",
    ):
        reference_kernels(registry)


def test_a_hook_returning_something_else_is_named():
    registry = with_plugin("bad", "BadReturn")
    with pytest.raises(HookImplementationError, match="plugin 'bad': kvcore_reference_kernels"):
        reference_kernels(registry)


def temperature_layers():
    from kernel_plugins import TemperatureAttentionSpec

    spec = TemperatureAttentionSpec(block_size=4, num_kv_heads=2, head_size=4, dtype="float64")
    return {"t.0": spec, "t.1": full_spec(head_size=4, heads=2)}


def test_a_spec_without_a_kernel_is_refused_naming_its_plugin():
    registry = with_plugin("tempo", "NoKernel")
    with pytest.raises(UnknownSpecError, match=r"layer 't.0'.*plugin 'tempo' serves it but"):
        ReferenceModel.from_specs(temperature_layers(), registry=registry)


def test_a_third_party_kernel_runs_through_the_executor():
    registry = with_plugin("tempo", "Temperature")
    layers = temperature_layers()
    groups = [
        KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=spec) for name, spec in layers.items()
    ]
    config = kvcore.planning.get_kv_cache_config(groups, 0, num_blocks=24)
    manager = kvcore.KVCacheManager(config, 64, registry=registry)
    model = ReferenceModel.from_specs(layers, registry=registry)
    executor = Executor(model, manager, kvcore.allocate_kv_cache(config))
    requests = [
        EngineRequest(
            request_id=f"r{i}",
            prompt_token_ids=list(range(i, i + 20)),
            max_output_tokens=5,
            arrival_step=i,
        )
        for i in range(4)
    ]
    ReferenceEngine(executor, requests).run()
    report = executor.check()
    assert report.ok
    assert report.positions_checked >= 4 * 24 - 20
