"""Both block-key functions chain as the prefix cache needs (equal keys exactly for equal prefixes, any start
and parent), and the simulator's (Python's tuple hash) is the same in every process."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from kvloop.engine.kv.hashing import ChainHasher, TupleChainKeys, chain_hashes

BS = 16
KEY_FUNCTIONS = [ChainHasher, TupleChainKeys]


def _prompts(rng: random.Random) -> list[list[int]]:
    """Prompts over a few shared prefixes (a document, a chat history) with their own tails, and prompts that
    repeat one block or reorder a few (equal blocks after different parents: their keys must differ)."""
    shared = [[rng.randrange(50_000) for _ in range(rng.randrange(0, 300))] for _ in range(4)]
    blocks = [[rng.randrange(50_000) for _ in range(BS)] for _ in range(3)]
    reordered = [sum((blocks[i] for i in rng.choices(range(3), k=6)), []) for _ in range(10)]
    return ([rng.choice(shared) + [rng.randrange(50_000) for _ in range(rng.randrange(0,
                                                                                      80))]
                                                                                      for _ in range(60)]
            + [blocks[0] * 8] + reordered)


@pytest.mark.parametrize("make", KEY_FUNCTIONS)
def test_keys_chain_from_any_start(make):
    keys, rng = make(BS, b"model"), random.Random(0)
    for tokens in _prompts(rng):
        whole = keys(tokens)
        assert len(whole) == len(tokens) // BS
        start = rng.randrange(0, len(whole) + 1)
        num = rng.choice([None, rng.randrange(0, len(whole) + 2)])
        parent = whole[start - 1] if start else 0
        end = len(whole) if num is None else min(len(whole), start + num)
        assert keys(tokens, num, parent, start) == whole[start:end]


@pytest.mark.parametrize("make", KEY_FUNCTIONS)
def test_equal_keys_exactly_for_equal_prefixes(make):
    keys, rng = make(BS, b"model"), random.Random(1)
    prompts = _prompts(rng)
    prefix_of: dict[int, tuple[int, ...]] = {}
    for tokens in prompts:
        for i, h in enumerate(keys(tokens)):
            prefix = tuple(tokens[: (i + 1) * BS])
            assert prefix_of.setdefault(h, prefix) == prefix  # no two prefixes share a key
    assert len(prefix_of) < sum(len(t) // BS for t in prompts)  # shared prefixes did share keys
    assert set(make(BS, b"other model")(prompts[0])).isdisjoint(keys(prompts[0]))  # the extra key counts


def test_chain_hasher_gives_chain_hashes():
    tokens = list(range(1000))
    assert ChainHasher(BS, b"m")(tokens) == chain_hashes(tokens, BS, b"m")


def test_tuple_keys_are_the_same_in_every_process():
    """str and bytes hash differently per process (PYTHONHASHSEED); tuples of ints do not: the simulator's
    runs repeat exactly."""
    code = ("from kvloop.engine.kv.hashing import TupleChainKeys; "
            "print(TupleChainKeys(16, b'llama')(list(range(7, 300))))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    assert outs.pop().strip() == str(TupleChainKeys(16, b"llama")(list(range(7, 300))))
