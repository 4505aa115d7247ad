"""benchmarks/profile_layers.py without py-spy: how a sample is given its operation and layer.

py-spy's raw output is one line per distinct stack, frames outermost first
and separated by ``;``, then the number of samples. A sample belongs to the
operation whose marker it runs under and to the layer of its innermost
kvcore frame; the collector is a layer of its own wherever it runs.
"""

from __future__ import annotations

from benchmark_scripts import load_benchmark

profile_layers = load_benchmark("profile_layers")

MARK = "decode (_callgrind_marks.py:3)"
CALL = "replay_marked.<locals>.decode (bench_native.py:135)"
MANAGER = "KVCacheManager.allocate_slots (kvcore/_kv_cache_manager.py:414)"
POOL = "NativeBlockPool._take (kvcore/_native_pool.py:176)"
CORE = "Core_take_blocks (kvcore/_native.c:1261)"


def test_each_sample_counts_in_its_operation_under_its_innermost_kvcore_frame() -> None:
    raw = [
        f"<module> (x.py:1);{MARK};{CALL};{MANAGER} 7",
        f"<module> (x.py:1);{MARK};{CALL};{MANAGER};{POOL} 5",
        f"<module> (x.py:1);{MARK};{CALL};{MANAGER};{POOL};{CORE};memcpy (libc.so.6) 3",
        f"<module> (x.py:1);{MARK};{CALL};{MANAGER};gc_collect_main (libpython3.11.so) 2",
        f"<module> (x.py:1);{MARK};{CALL} 1",
        # Outside every marker: the replay's own setup, left out.
        f"<module> (x.py:1);record_ops (_replay.py:266);{MANAGER} 11",
        "",
    ]
    counts = profile_layers.tally(raw)
    assert dict(counts["decode"]) == {
        "manager layers": 7,
        "pool, Python part": 5,
        "compiled pool": 3,
        "garbage collection": 2,
        "replay": 1,
    }
    assert sum(counts["lookup"].values()) == sum(counts["free"].values()) == 0


def test_hashing_the_request_and_its_object_are_layers_of_their_own() -> None:
    hashing = "hash_blocks (kvcore/_native_hash.c:88)"
    request = "Request.append_output_token_ids (kvcore/_request.py:201)"
    plugin = "FullAttentionManager.remove_skipped_blocks (plugins/full_attention/manager.py:50)"
    lookup = "lookup (_callgrind_marks.py:1)"
    raw = [
        f"{lookup};{MANAGER};{request};{hashing};SHA256_Update (libcrypto.so.3) 4",
        f"{lookup};{MANAGER};{request} 2",
        f"{lookup};{MANAGER};{plugin} 1",
        f"{lookup};{MANAGER};{plugin};listcomp (x.py:3) 1",
    ]
    counts = profile_layers.tally(raw)["lookup"]
    assert dict(counts) == {"compiled hashing": 4, "request": 2, "manager layers": 2}
