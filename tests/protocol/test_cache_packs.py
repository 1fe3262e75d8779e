"""The feature cache's packs: what a pack holds is what its index says, byte for byte, and
anything that is not a pack's head is refused with a ValueError, whatever its bytes."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hapi.protocol import (
    PACK_HEAD,
    context_digest,
    encode_pack,
    entry_path,
    is_cached,
    is_entry,
    is_pack,
    pack_index_length,
    pack_path,
    pack_prefix,
    parse_pack_index,
)
from hapi.protocol._cache import MAX_PACK_INDEX, PACK_MAGIC, PACK_PREFIX

_PATHS = st.text("0123456789abcdef", min_size=64, max_size=64).map(entry_path)
_ENTRIES = st.lists(st.tuples(_PATHS, st.binary(max_size=2000)), min_size=1, max_size=12)


@given(_ENTRIES)
def test_every_member_reads_back_from_the_offsets_its_index_names(entries) -> None:
    body, index = encode_pack(entries)
    assert body[PACK_HEAD : PACK_HEAD + pack_index_length(body)] == index
    members = parse_pack_index(index)
    first = {}
    for path, data in entries:
        first.setdefault(path, data)  # a path twice: the first member is the one read
    assert set(members) == set(first)
    for path, data in first.items():
        member = members[path]
        read = body[member.offset : member.offset + member.length]
        assert read == data and hashlib.sha256(read).hexdigest() == member.sha256
    assert len(body) == PACK_HEAD + len(index) + sum(len(data) for _, data in entries)


@given(_ENTRIES, st.data())
def test_a_cut_head_is_refused_or_reads_no_member(entries, data) -> None:
    body, index = encode_pack(entries)
    cut = data.draw(st.integers(0, PACK_HEAD + len(index) - 1))
    head = body[:cut]
    if cut < PACK_HEAD:
        with pytest.raises(ValueError, match="not a feature cache pack"):
            pack_index_length(head)
        return
    with pytest.raises(ValueError, match="not a pack index"):
        parse_pack_index(head[PACK_HEAD:])  # the index cut short is not JSON


@given(st.binary(max_size=64))
def test_bytes_that_are_not_a_pack_are_refused(noise) -> None:
    if noise.startswith(PACK_MAGIC) and len(noise) >= PACK_HEAD:
        return  # a pack's head by chance (the length is checked below)
    with pytest.raises(ValueError, match="not a feature cache pack"):
        pack_index_length(noise)


def test_an_index_longer_than_the_bound_is_refused() -> None:
    head = PACK_MAGIC + struct.pack("<Q", MAX_PACK_INDEX + 1)
    with pytest.raises(ValueError, match="over"):
        pack_index_length(head)


@pytest.mark.parametrize(
    "index",
    [
        b'{"entries": {}}',
        b'{"entries": [["p", -1, 3, "ab"]]}',
        b'{"entries": [["p", 0, true, "ab"]]}',
        b'{"entries": [["p", 0, 3]]}',
        b'{"entries": [[1, 0, 3, "ab"]]}',
        b'{"members": []}',
        b"[]",
    ],
)
def test_an_index_of_the_wrong_shape_is_refused(index) -> None:
    with pytest.raises(ValueError, match="not a pack index"):
        parse_pack_index(index)


def test_a_contexts_packs_lie_under_its_prefix_and_list_oldest_first() -> None:
    blocks, preset = ["b1", "b2"], {"size": 224}
    context = context_digest("photos", blocks=blocks, preprocess=preset, dtype="float32")
    keys = [pack_path(context, stamp_ms=stamp, nonce="ab12") for stamp in (9, 10, 1_700_000)]
    assert all(key.startswith(pack_prefix(context)) and is_pack(key) for key in keys)
    assert keys == sorted(keys)  # the stamp is zero-padded: key order is time order
    assert pack_prefix(context).startswith(PACK_PREFIX)
    assert not is_entry(keys[0]) and is_cached(keys[0])
    assert is_cached(entry_path("ab" * 32)) and not is_pack(entry_path("ab" * 32))


@pytest.mark.parametrize(
    "change",
    [
        {"bucket": "other"},
        {"blocks": ["b1"]},
        {"preprocess": {"size": 256}},
        {"dtype": "float16"},
        {"view": {"augment": "flip", "seed": 0, "view": 1}},
    ],
)
def test_each_input_of_a_context_names_another_one(change) -> None:
    inputs = {"bucket": "photos", "blocks": ["b1", "b2"], "preprocess": {"size": 224}}
    base = {**inputs, "dtype": "float32"}
    changed = {**base, **change}
    bucket = changed.pop("bucket")
    assert context_digest(bucket, **changed) != context_digest(base.pop("bucket"), **base)
