"""A request whose extra keys need multi-byte integers, and its keys' bytes written out.

The encoding (see ``test_extra_keys_encode_to_these_bytes`` in
``test_hashing.py``): a one-byte tag per value; tuple ``T``, str ``S`` and
bytes ``B`` followed by a 4-byte little-endian count or length; int ``I``,
one byte holding its size ``bit_length // 8 + 1``, then its two's
complement, little-endian.
"""

from __future__ import annotations

from kvcore import MultiModalFeature, Request

#: Block size 512; LoRA "ad", salt "s", an image "img" at tokens 300-699: block
#: 0 holds it at offset 300, block 1 (from token 512) at 300 - 512 = -212,
#: two bytes each (0x012c, 0x10000 - 212 = 0xff2c).
LONG_BLOCK_KEYS = (
    b"T\x03\x00\x00\x00"
    b"T\x02\x00\x00\x00"
    b"S\x04\x00\x00\x00lora"
    b"S\x02\x00\x00\x00ad"
    b"T\x03\x00\x00\x00"
    b"S\x02\x00\x00\x00mm"
    b"S\x03\x00\x00\x00img"
    b"I\x02\x2c\x01"
    b"T\x02\x00\x00\x00"
    b"S\x04\x00\x00\x00salt"
    b"S\x01\x00\x00\x00s",
    b"T\x02\x00\x00\x00"
    b"T\x02\x00\x00\x00"
    b"S\x04\x00\x00\x00lora"
    b"S\x02\x00\x00\x00ad"
    b"T\x03\x00\x00\x00"
    b"S\x02\x00\x00\x00mm"
    b"S\x03\x00\x00\x00img"
    b"I\x02\x2c\xff",
)


def long_block_request() -> Request:
    """1,024 tokens 0..1023 with the LoRA, salt and image of :data:`LONG_BLOCK_KEYS`."""
    image = MultiModalFeature(identifier="img", offset=300, length=400)
    return Request("r", list(range(1024)), lora_name="ad", cache_salt="s", mm_features=[image])
