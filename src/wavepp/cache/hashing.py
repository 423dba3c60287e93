"""Chained block hashes: the names under which a stage caches full blocks of KV.

    H_i = xxh3_64(token bytes of block i, seed = H_{i-1} xor K)     K = xxh3_64(extra keys, salt)

Seeding each block's hash with the previous hash chains them without building a new byte
string per block, so equal hashes mean equal whole prefixes (up to 64-bit collisions: the
odds of any among a million cached blocks are about 3 in 10^8). Only full blocks get a hash;
a partial last block is never shared. Token ids are hashed as little-endian int64 bytes, so
the result is the same in every process and on every machine (Python's `hash()` is salted
per process).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

_ROOT_SEED = xxhash.xxh3_64_intdigest(b"wavepp.cache.block-hash.v1")
_TOKEN_DTYPE = np.dtype("<i8")


def hash_blocks(
    token_ids: Sequence[int] | np.ndarray,
    block_size: int,
    *,
    extra_keys: bytes = b"",
    salt: bytes = b"",
    parent: int | None = None,
) -> list[int]:
    """Return the chained hash of every full block of `token_ids`, in order.

    token_ids: a list or a 1-D integer numpy array; a numpy array skips one conversion.
    extra_keys: bytes that also decide the KV (adapter id, image hashes...); salt: a tenant
        or cache-isolation key. Both enter every block's hash.
    parent: the hash of the block just before `token_ids[0]` when continuing a chain;
        None starts a new one. Hashing a prompt in pieces gives the same hashes as hashing it
        whole, as long as each piece but the last is a whole number of blocks.
    Mutates nothing; len(result) == len(token_ids) // block_size.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    tokens = _as_int64(token_ids)
    num_blocks = len(tokens) // block_size
    if num_blocks == 0:
        return []
    data = tokens[: num_blocks * block_size].tobytes()
    key = _chain_key(extra_keys, salt)
    digest = xxhash.xxh3_64_intdigest
    prev = _ROOT_SEED if parent is None else parent
    step = block_size * _TOKEN_DTYPE.itemsize
    hashes: list[int] = []
    append = hashes.append
    # bytes [0, step) block 0 | [step, 2*step) block 1 | ... ; one seeded hash per full block.
    # Two loops so the common case (no extra keys, no salt) skips a big-int xor per block.
    if key:
        for start in range(0, num_blocks * step, step):
            prev = digest(data[start : start + step], prev ^ key)
            append(prev)
    else:
        for start in range(0, num_blocks * step, step):
            prev = digest(data[start : start + step], prev)
            append(prev)
    return hashes


def _as_int64(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """1-D little-endian int64 view or copy of the token ids; lists convert in one call."""
    if isinstance(token_ids, np.ndarray):
        if token_ids.dtype.kind not in "iu":
            raise ValueError(f"token_ids must be integers, got dtype {token_ids.dtype}")
        tokens = token_ids.astype(_TOKEN_DTYPE, copy=False)
    else:
        tokens = np.array(token_ids, dtype=_TOKEN_DTYPE)
    if tokens.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tokens.shape}")
    return tokens


def _chain_key(extra_keys: bytes, salt: bytes) -> int:
    """Fold extra keys and salt into one 64-bit key; (b"ab", b"") and (b"a", b"b") differ."""
    if not extra_keys and not salt:
        return 0
    header = len(extra_keys).to_bytes(8, "little")
    return xxhash.xxh3_64_intdigest(header + bytes(extra_keys) + bytes(salt))
