"""The split models against independent references: transformers' BertModel, brute-force decoding,
hand-written formulas."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from transformers import BertConfig, BertForTokenClassification, BertModel

from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.models.bert import BertSplitConfig, build_bert
from collapipe_flwr.models.decoder_cache import DecoderCache
from collapipe_flwr.models.transformer import (
    TransformerConfig,
    TranslationHead,
    build_transformer,
    sinusoidal_positions,
)

SIZES = dict(vocab_size=40, hidden=16, n_heads=2, d_ff=24, layers=3, dropout=0.0, max_len=12)


def hf_config(layers: int = 3) -> BertConfig:
    sizes = dict(vocab_size=40, hidden_size=16, num_attention_heads=2, intermediate_size=24, max_position_embeddings=12)
    return BertConfig(**sizes, num_hidden_layers=layers, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def inputs():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 40, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    return ids * mask, mask


@pytest.mark.parametrize("head", ["token", "sequence"])
def test_bert_split_equals_transformers_bertmodel(tmp_path, head):
    torch.manual_seed(0)
    reference = BertModel(hf_config()).eval()
    reference.save_pretrained(tmp_path)  # model.safetensors, names embeddings.* / encoder.layer.{l}.*
    model = build_bert(BertSplitConfig(**SIZES, head=head, num_labels=4), pretrained_dir=str(tmp_path)).eval()
    ids, mask = inputs()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask)
        z = model.encode(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(z[real], expected.last_hidden_state[real], rtol=1e-5, atol=1e-5)
    if head == "sequence":
        torch.testing.assert_close(model.head.pooler(z), expected.pooler_output, rtol=1e-5, atol=1e-5)


def test_bert_loads_prefixed_bin_checkpoint_with_old_layernorm_names(tmp_path):
    torch.manual_seed(1)
    reference = BertForTokenClassification(hf_config(layers=4)).eval()  # more layers than we use
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in reference.state_dict().items()
    }
    assert any(k.startswith("bert.encoder.layer.3.") for k in state)
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = build_bert(BertSplitConfig(**SIZES, head="token", num_labels=4), pretrained_dir=str(tmp_path))
    for l in range(3):
        ours = model.blocks[l].layer.attention.output.LayerNorm.weight
        theirs = reference.bert.encoder.layer[l].attention.output.LayerNorm.weight
        assert torch.equal(ours, theirs)
    assert torch.equal(
        model.embedding.embeddings.word_embeddings.weight, reference.bert.embeddings.word_embeddings.weight
    )


def test_bert_pretrained_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="is not a folder"):
        build_bert(BertSplitConfig(**SIZES, head="token", num_labels=4), pretrained_dir=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="neither model.safetensors nor pytorch_model.bin"):
        build_bert(BertSplitConfig(**SIZES, head="token", num_labels=4), pretrained_dir=str(tmp_path))
    BertModel(hf_config(layers=2)).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="at least 3 encoder layers"):
        build_bert(BertSplitConfig(**SIZES, head="token", num_labels=4), pretrained_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"shape \(40, 16\) but the model expects \(50, 16\)"):
        build_bert(
            BertSplitConfig(**{**SIZES, "vocab_size": 50, "layers": 2}, head="token", num_labels=4),
            pretrained_dir=str(tmp_path),
        )


def test_bert_token_and_sequence_losses_are_sums_with_counts():
    model = build_bert(BertSplitConfig(**SIZES, head="token", num_labels=4)).eval()
    ids, mask = inputs()
    labels = torch.randint(0, 4, ids.shape).masked_fill(mask == 0, -100)
    labels[:, 0] = -100
    z = model.encode(ids, mask)
    loss_sum, count = model.head.loss_terms(z, mask, {"labels": labels})
    logits = model.head.logits(z)
    keep = labels != -100
    manual = -sum(torch.log_softmax(logits[b, t], -1)[labels[b, t]] for b, t in keep.nonzero().tolist())
    assert int(count) == int(keep.sum())
    torch.testing.assert_close(loss_sum, manual)
    assert model.head.predict(z, mask).shape == ids.shape

    seq = build_bert(BertSplitConfig(**SIZES, head="sequence", num_labels=4)).eval()
    z = seq.encode(ids, mask)
    y = torch.tensor([0, 3, 1])
    loss_sum, count = seq.head.loss_terms(z, mask, {"labels": y})
    cls = torch.tanh(seq.head.pooler.dense(z[:, 0]))
    manual = -torch.log_softmax(seq.head.classifier(cls), -1)[torch.arange(3), y].sum()
    assert int(count) == 3
    torch.testing.assert_close(loss_sum, manual)
    assert seq.head.predict(z, mask).shape == (3,)


def test_bert_padding_does_not_leak_into_real_tokens():
    model = build_bert(BertSplitConfig(**SIZES, head="token", num_labels=4)).eval()
    ids, mask = inputs()
    other = ids.clone()
    other[mask == 0] = 7
    with torch.no_grad():
        a, b = model.encode(ids, mask), model.encode(other, mask)
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()])


def test_sinusoidal_positions_match_the_formula():
    pe = sinusoidal_positions(10, 6)
    assert pe[1, 0] == pytest.approx(math.sin(1.0), abs=1e-6)
    assert pe[1, 1] == pytest.approx(math.cos(1.0), abs=1e-6)
    assert pe[3, 2] == pytest.approx(math.sin(3 / 10000 ** (2 / 6)), abs=1e-6)
    assert pe[7, 5] == pytest.approx(math.cos(7 / 10000 ** (4 / 6)), abs=1e-6)


TINY = TransformerConfig(
    src_vocab=20,
    tgt_vocab=12,
    d_model=16,
    n_heads=2,
    d_ff=32,
    enc_layers=2,
    dec_layers=2,
    dropout=0.0,
    max_len=12,
    pad_id=0,
)


def tiny_translation(tgt_vocab: int = 12):
    torch.manual_seed(5)
    model = build_transformer(dataclasses.replace(TINY, tgt_vocab=tgt_vocab)).eval()
    # make the output distribution peaked enough that decoding choices are not ties
    with torch.no_grad():
        model.head.generator.weight.mul_(8)
    return model


def test_transformer_embedding_scales_and_adds_positions():
    model = tiny_translation()
    ids, _ = inputs()
    ids = ids % 20
    expected = model.embedding.tokens.weight[ids] * 4.0 + sinusoidal_positions(12, 16)[:9]
    torch.testing.assert_close(model.embedding(ids), expected)


def test_transformer_decoder_is_causal_and_ignores_source_padding():
    model = tiny_translation()
    ids, mask = inputs()
    ids = ids % 20
    dec = torch.tensor([[1, 4, 5, 6], [1, 7, 8, 9], [1, 3, 3, 3]])
    with torch.no_grad():
        z = model.encode(ids, mask)
        logits = model.head.logits(z, mask, dec)
        changed_future = dec.clone()
        changed_future[:, 3] = 11
        logits2 = model.head.logits(z, mask, changed_future)
        ids2 = ids.clone()
        ids2[mask == 0] = 13
        logits3 = model.head.logits(model.encode(ids2, mask), mask, dec)
    torch.testing.assert_close(logits[:, :3], logits2[:, :3])
    torch.testing.assert_close(logits, logits3)


def test_transformer_loss_is_token_sum_over_non_ignored_labels():
    model = tiny_translation()
    ids, mask = inputs()
    ids = ids % 20
    dec = torch.tensor([[1, 4, 5, 6], [1, 7, 0, 0], [1, 3, 3, 0]])
    labels = torch.tensor([[4, 5, 6, 2], [7, 2, -100, -100], [3, 3, 2, -100]])
    batch = {"decoder_input_ids": dec, "labels": labels}
    z = model.encode(ids, mask)
    loss_sum, count = model.head.loss_terms(z, mask, batch)
    logp = torch.log_softmax(model.head.logits(z, mask, dec), -1)
    manual = -sum(logp[b, t, labels[b, t]] for b in range(3) for t in range(4) if labels[b, t] != -100)
    assert int(count) == 9
    torch.testing.assert_close(loss_sum, manual)


def test_transformer_smoothed_loss_and_gradients_equal_the_all_positions_cross_entropy():
    """The generator runs on target positions only; the reference runs it on every position and lets
    cross_entropy ignore the padding: the same label-smoothed loss and the same gradient of every weight."""
    model = build_transformer(dataclasses.replace(TINY, label_smoothing=0.1)).train()
    ids, mask = inputs()
    ids = ids % 20
    dec = torch.tensor([[1, 4, 5, 6], [1, 7, 0, 0], [1, 3, 3, 0]])
    labels = torch.tensor([[4, 5, 6, 2], [7, 2, -100, -100], [3, 3, 2, -100]])
    z = model.encode(ids, mask).detach()
    loss_sum, _ = model.head.loss_terms(z, mask, {"decoder_input_ids": dec, "labels": labels})
    got = torch.autograd.grad(loss_sum, list(model.head.parameters()))
    logits = model.head.logits(z, mask, dec)
    ref = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 12), labels.reshape(-1), ignore_index=-100, reduction="sum", label_smoothing=0.1
    )
    want = torch.autograd.grad(ref, list(model.head.parameters()))
    torch.testing.assert_close(loss_sum, ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def sequence_logprob(model, z, mask, seq, bos, eos) -> float:
    """log p(seq) by teacher forcing the whole sequence at once (independent of the decoders' loops)."""
    dec = torch.tensor([[bos] + seq[:-1]])
    logp = torch.log_softmax(model.head.logits(z, mask, dec), -1)[0]
    return float(sum(logp[t, tok] for t, tok in enumerate(seq)))


def test_cached_decoding_step_equals_the_full_prefix_forward():
    """DecoderCache's logits at every position equal nn.TransformerDecoder's teacher-forced logits of the prefix
    (padded sources included): the cache changes the cost, not the function."""
    model = tiny_translation(tgt_vocab=30)
    ids, mask = inputs()
    ids = ids % 20
    g = torch.Generator().manual_seed(7)
    targets = torch.randint(3, 30, (3, 8), generator=g)  # no padding, no BOS
    with torch.no_grad():
        z = model.encode(ids, mask)
        head = model.head
        cache = DecoderCache(head.decoder.layers, head.memory_norm(z), mask == 0)
        for t in range(targets.shape[1]):
            step = head._incremental_logits(targets[:, t], cache)
            full = head.logits(z, mask, targets[:, : t + 1])[:, -1]
            torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
        assert cache.length == targets.shape[1]


@pytest.mark.parametrize("head_mode", ["eval", "train"])  # eval: incremental (cached) decoding; train: full prefix
def test_greedy_decode_picks_the_argmax_at_every_step(head_mode):
    model = tiny_translation()
    ids, mask = inputs()
    ids = ids % 20
    bos, eos, max_len = 1, 2, 6
    with torch.no_grad():
        z = model.encode(ids, mask)
        model.head.train(head_mode == "train")  # dropout is 0: both modes compute the same function
        out = model.head.greedy_decode(z, mask, max_len, bos, eos)
        model.head.eval()
        for b, tokens in enumerate(out):
            full = tokens + ([eos] if len(tokens) < max_len else [])
            dec = torch.tensor([[bos] + full[:-1]])
            logits = model.head.logits(z[b : b + 1], mask[b : b + 1], dec)[0]
            logits[:, [0, bos]] = -math.inf  # decoding never emits padding or BOS
            assert logits.argmax(-1).tolist() == full
            assert eos not in tokens and len(tokens) <= max_len


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_search_with_a_wide_beam_finds_the_brute_force_best(alpha):
    V, bos, eos, max_len = 5, 1, 2, 3
    model = tiny_translation(tgt_vocab=V)
    ids, mask = inputs()
    ids = ids % 20
    tokens = [t for t in range(V) if t not in (0, bos)]  # never emit pad or bos
    with torch.no_grad():
        z = model.encode(ids, mask)
        out = model.head.beam_decode(z, mask, max_len, bos, eos, beam_size=V**max_len, length_penalty=alpha)
        for b in range(z.shape[0]):
            best, best_score = None, -math.inf
            for n in range(1, max_len + 1):
                for seq in itertools.product(tokens, repeat=n):
                    seq = list(seq)
                    if eos in seq[:-1] or (n < max_len and seq[-1] != eos):
                        continue
                    # scores use the full softmax; pad and BOS are simply never emitted
                    score = sequence_logprob(model, z[b : b + 1], mask[b : b + 1], seq, bos, eos) / n**alpha
                    if score > best_score:
                        best, best_score = seq, score
            expected = [t for t in best if t != eos]
            assert out[b] == expected, (b, out[b], expected)


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(d_model=15, n_heads=2), "not divisible"),
        (dict(enc_layers=0), "enc_layers=0"),
        (dict(dropout=1.5), "dropout"),
        (dict(label_smoothing=1.0), "task.label_smoothing=1.0"),
    ],
)
def test_transformer_config_rejects_bad_sizes(kwargs, words):
    with pytest.raises(CollaPipeError, match=words):
        dataclasses.replace(TINY, **kwargs)


def test_configs_are_frozen_and_the_translation_head_takes_the_same_config():
    config = TransformerConfig(20, 12, 16, 2, 32, 2, 3, 0.0, 12, 0, label_smoothing=0.1, tie_embeddings=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 32  # type: ignore[misc]
    built = build_transformer(config).head
    head = TranslationHead(config)
    assert len(head.decoder.layers) == 3 and head.label_smoothing == 0.1
    assert head.generator.weight is head.tgt_embedding.tokens.weight
    assert set(head.state_dict()) == set(built.state_dict())
    with pytest.raises(dataclasses.FrozenInstanceError):
        BertSplitConfig(**SIZES, head="token", num_labels=4).layers = 1  # type: ignore[misc]


def test_bert_config_rejects_bad_head_and_labels_and_the_model_long_inputs():
    with pytest.raises(ConfigError, match="token or token_crf .NER. or sequence"):
        BertSplitConfig(**SIZES, head="lm", num_labels=4)
    with pytest.raises(ConfigError, match="num_labels=1 must be >= 2"):
        BertSplitConfig(**SIZES, head="token", num_labels=1)
    with pytest.raises(ConfigError, match="model.hidden=16 is not divisible by model.n_heads=3"):
        BertSplitConfig(**{**SIZES, "n_heads": 3}, head="token", num_labels=4)
    model = build_bert(BertSplitConfig(**SIZES, head="token", num_labels=4))
    with pytest.raises(ConfigError, match="max_len=12"):
        model.embedding(torch.ones(1, 13, dtype=torch.long))
