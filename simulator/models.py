"""The model table: KV-cache bytes per token, computed from each model's architecture.

Data lives in `models.yaml` beside this file. Standard attention stores K and V for every layer
and KV head: ``2 x layers x kv_heads x head_dim x dtype_bytes`` (Llama-3.1-8B in bf16:
2 x 32 x 8 x 128 x 2 = 131,072 B). MLA (DeepSeek) stores one compressed latent of
``kv_lora_rank`` values plus the ``qk_rope_head_dim`` decoupled RoPE key per layer, shared by K
and V: ``layers x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes``.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import yaml

GIB = 1 << 30
_TABLE = Path(__file__).with_name("models.yaml")


class ModelError(ValueError):
    """An unknown model name or a malformed model table entry."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    hf: str
    attention: str  # "gqa" (standard MHA/GQA) or "mla"
    layers: int
    dtype_bytes: int
    weights_gib: float
    kv_heads: int = 0
    head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0

    @property
    def kv_bytes_per_token(self) -> int:
        if self.attention == "mla":
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def tokens_for_gib(self, gib: float) -> int:
        """How many tokens of KV cache fit in `gib` GiB (rounded down)."""
        return int(gib * GIB // self.kv_bytes_per_token)

    def gib_for_tokens(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / GIB


@functools.cache
def models() -> dict[str, ModelSpec]:
    """All models in the table, by name."""
    raw = yaml.safe_load(_TABLE.read_text())
    out: dict[str, ModelSpec] = {}
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    for name, entry in raw.items():
        unknown = set(entry) - fields
        if unknown:
            raise ModelError(f"{_TABLE}: model {name!r}: unknown key(s) {', '.join(sorted(unknown))}")
        spec = ModelSpec(name=name, **entry)
        if spec.attention not in ("gqa", "mla") or spec.kv_bytes_per_token <= 0:
            raise ModelError(f"{_TABLE}: model {name!r}: bad attention/architecture fields")
        out[name] = spec
    return out


def get_model(name: str) -> ModelSpec:
    table = models()
    if name not in table:
        raise ModelError(f"model: unknown model {name!r}; valid choices: {', '.join(table)}")
    return table[name]
