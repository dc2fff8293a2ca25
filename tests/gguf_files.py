"""A tiny Llama GGUF file written with the ``gguf`` package's own writer, for tests that load GGUF files through
transformers in a second (SmolLM2's 98 MB file takes 20-30 s): 2 layers, hidden 64, 4 heads (2 key-value heads),
a 64-token byte-level BPE with three merges, Q4_1 matrices (as SmolLM2's file) and fp32 norms, tied embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 64, 4, 2, 128, 2
MERGES = ["t h", "th e", "a n"]
TOKENS = ["<|endoftext|>", "<pad>", *(chr(c) for c in range(ord("a"), ord("z") + 1)), "Ġ", "th", "the", "an"]
TOKENS += [f"<extra_{i}>" for i in range(64 - len(TOKENS))]


def _metadata(writer) -> None:
    writer.add_name("tiny-llama")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))  # 3: control tokens
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(1)


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    """Write the tiny Llama GGUF file to ``path`` (weights drawn from ``seed``); returns ``path``."""
    import gguf
    from gguf import GGMLQuantizationType

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    _metadata(writer)

    def matrix(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        packed = gguf.quants.quantize(data, GGMLQuantizationType.Q4_1)
        writer.add_tensor(name, packed, raw_dtype=GGMLQuantizationType.Q4_1)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    kv = HIDDEN * KV_HEADS // HEADS
    matrix("token_embd.weight", len(TOKENS), HIDDEN)
    for i in range(LAYERS):
        for part, rows, cols in [("attn_q", HIDDEN, HIDDEN), ("attn_k", kv, HIDDEN), ("attn_v", kv, HIDDEN)]:
            matrix(f"blk.{i}.{part}.weight", rows, cols)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        matrix(f"blk.{i}.ffn_gate.weight", FF, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FF, HIDDEN)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FF)
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
