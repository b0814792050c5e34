"""Token-id prompts for the real engine from a workload frame (pure).

The workload generator describes a prompt by its chained 512-token block ids (`hash_ids`, Mooncake
semantics): two prompts share block j exactly when they agree up to the end of that block. Each
block id becomes 512 token ids drawn from a generator seeded by (salt, block id), and a prompt is
its blocks' tokens cut to `input_length`. So two prompts share a token prefix exactly where the
workload says they share blocks, and the engine's prefix cache sees the sharing the twin sees.
A different `salt` gives the same workload with content no earlier stream has put in the cache.

The tiny model's vocabulary keeps ids 0-3 for special tokens, so ids are drawn from 4..vocab-1.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import polars as pl

BLOCK_TOKENS = 512
FIRST_ID = 4  # <unk> <s> </s> <pad>
DEFAULT_VOCAB = 4096


class PromptBuilder:
    """Prompt token ids from block ids, with the blocks' tokens cached (a stream reuses blocks)."""

    def __init__(self, *, salt: int = 0, vocab: int = DEFAULT_VOCAB) -> None:
        if vocab <= FIRST_ID + 1:
            raise ValueError(f"vocab: need more than {FIRST_ID + 1} ids, got {vocab}")
        self.salt, self.vocab = int(salt), int(vocab)
        self._blocks: dict[int, np.ndarray] = {}

    def block(self, block_id: int) -> np.ndarray:
        ids = self._blocks.get(block_id)
        if ids is None:
            rng = np.random.default_rng([self.salt & 0xFFFFFFFF, int(block_id) & 0xFFFFFFFFFFFFFFFF])
            ids = self._blocks[block_id] = rng.integers(FIRST_ID, self.vocab, BLOCK_TOKENS, dtype=np.int64)
        return ids

    def prompt(self, hash_ids: Sequence[int], input_length: int) -> list[int]:
        if input_length < 1:
            raise ValueError(f"input_length: a prompt needs at least one token, got {input_length}")
        need = -(-input_length // BLOCK_TOKENS)
        if len(hash_ids) < need:
            raise ValueError(f"{input_length} tokens need {need} block ids, got {len(hash_ids)}")
        ids = np.concatenate([self.block(h) for h in hash_ids[:need]])
        return ids[:input_length].tolist()


def prompts(frame: pl.DataFrame, builder: PromptBuilder) -> Iterator[list[int]]:
    """The token ids of every row of a workload frame, in order."""
    for hashes, length in zip(frame["hash_ids"].to_list(), frame["input_length"].to_list(), strict=True):
        yield builder.prompt(hashes, int(length))


def cap_prompt_length(frame: pl.DataFrame, max_tokens: int) -> pl.DataFrame:
    """Only the requests whose prompts fit the engine's context (`max_model_len` minus the output)."""
    return frame.filter(pl.col("input_length") <= max_tokens)


__all__ = ["BLOCK_TOKENS", "PromptBuilder", "cap_prompt_length", "prompts"]
