"""SyncSpeech (TMT): sequence layouts (Eq. 3, Eq. 6), the hybrid attention mask and the targets against
hand-worked examples (the paper's Fig. 1 case n=2, q=1 among them); streaming decoding on tiny
random models: L + 1 passes, start after q + 1 text tokens, cached == uncached, each pass fed
exactly the training sequence; the token-level logic of `arnar stream`."""

from __future__ import annotations

import io
import math

import pytest
import torch

from arnar.evaluate.metrics import ForwardPassCounter, fpl_l, syncspeech_fpl_l
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import (
    EOS,
    IGNORE,
    MASK,
    PAD,
    SOS,
    SPEECH_BOS,
    TURN,
    SynthesisRequest,
    Utterance,
    Vocab,
    collate,
)
from arnar.paradigms.syncspeech import (
    DURATION,
    END_OF_TEXT,
    Layout,
    StreamStep,
    durations,
    finetune_sequence,
    hybrid_attention_mask,
    marker,
    packed_finetune_sequence,
    pretrain_sequence,
    pretrain_text_mask,
    span_part,
    speech_chunks,
    text_part,
    uniform_ends,
)
from arnar.stream import Upstream, bpe_tokens, latency_summary, run_stream, words

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "dropout": 0.0}
VOCAB = Vocab(text_size=10, speech_size=20)  # text ids 8..17, speech ids 18..37
E, D, M, X = END_OF_TEXT, DURATION, MASK, IGNORE

# The paper's Fig. 1 utterance: y_2 owns s_7..s_11 (a_1 = 6, a_2 = 11); then two short tokens.
PAPER_TEXT = torch.tensor([1, 2, 3, 4])  # shared ids 9, 10, 11, 12
PAPER_SPEECH = torch.arange(14)  # code i -> shared id 18 + i
PAPER_ENDS = torch.tensor([6, 11, 13, 14])


def paper_utterance() -> Utterance:
    return Utterance("spk00_0001", "spk00", PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS)


def matrix(rows: list[str]) -> list[list[bool]]:
    return [[c == "1" for c in row] for row in rows]


def model(**options):
    """A tiny random model whose outputs vary with position and context (large random weights: at
    the default init a random model says the same token at every mask, hiding order mistakes)."""
    torch.manual_seed(0)
    net = build_paradigm("syncspeech", VOCAB, TINY, max_duration=6, **options).eval()
    with torch.no_grad():
        for weight in (net.embed.weight, net.head.weight, net.duration_head.weight):
            weight.normal_(std=1.0)
        for weight in net.backbone.parameters():
            if weight.dim() == 2:
                weight.normal_(std=0.5)
    return net


# ----------------------------------------------------------------------------- layouts

def test_markers_are_no_other_token():
    """E and D must be ids that no text token, speech code or base special token (the mask among
    them) is ever mapped to, else a marker would read as a word or a frame. With VOCAB, worked
    out by hand: specials 0..7, text 8..17, speech 18..37."""
    text_ids = set(VOCAB.text(torch.arange(10)).tolist())
    speech_ids = set(VOCAB.speech(torch.arange(20)).tolist())
    assert text_ids == set(range(8, 18)) and speech_ids == set(range(18, 38))
    base_specials = {PAD, SOS, TURN, EOS, MASK, SPEECH_BOS}
    assert len({END_OF_TEXT, DURATION}) == 2
    assert not {END_OF_TEXT, DURATION} & (text_ids | speech_ids | base_specials)
    assert max(END_OF_TEXT, DURATION) < VOCAB.text_offset  # inside the special block of every vocabulary


def test_finetune_sequence_paper_example_n2_q1():
    layout, targets = finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=2, q=1)
    # y1 y2 y3 | E D s1..s6 D <mask>x5 D   (L' = min(4, 2 + 1) = 3; the span of y2 is masked)
    assert layout.input_ids.tolist() == [9, 10, 11, E, D, 18, 19, 20, 21, 22, 23, D, M, M, M, M, M, D]
    assert layout.position_ids.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert layout.is_text.tolist() == [True] * 3 + [False] * 15
    assert layout.span.tolist() == [-1] * 5 + [0] * 6 + [-1] + [1] * 5 + [-1]
    assert layout.duration_of.tolist() == [-1] * 4 + [0] + [-1] * 6 + [1] + [-1] * 5 + [2]
    assert layout.text_seen.tolist() == [0] * 3 + [3] * 15
    # Eq. 4: the true tokens s7..s11 (codes 6..10) at the masks, nothing elsewhere
    assert targets.tolist() == [X] * 12 + [24, 25, 26, 27, 28] + [X]


def test_finetune_sequence_edges_n1_and_nL():
    layout, targets = finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=1, q=1)
    assert layout.input_ids.tolist() == [9, 10, E, D, M, M, M, M, M, M, D]
    assert layout.position_ids.tolist() == [0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert targets.tolist() == [X] * 4 + [18, 19, 20, 21, 22, 23] + [X]
    layout, targets = finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=4, q=1)
    # n = L: the whole text, spans 1..3 real, the one frame of y4 masked, the trailing D
    assert layout.input_ids.tolist() == [9, 10, 11, 12, E, D, *range(18, 24), D, *range(24, 29), D, 29, 30, D, M, D]
    assert layout.duration_of.tolist()[-1] == 4  # l_5 does not exist: no target (see below)
    assert targets.tolist() == [X] * 22 + [31, X]
    layout, _ = finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=1, q=0)
    assert layout.input_ids.tolist()[:3] == [9, E, D]  # q = 0: only y1 is seen
    with pytest.raises(ValueError):
        finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=5, q=1)


def test_hybrid_mask_paper_example_hand_worked():
    layout, _ = finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=2, q=1)
    # causal everywhere, plus the span of y1 (positions 5..10) and the masks of y2 (12..16) see
    # each other both ways; text never sees the speech stream
    expected = matrix([
        "100000000000000000",  # y1
        "110000000000000000",  # y2
        "111000000000000000",  # y3
        "111100000000000000",  # E
        "111110000000000000",  # D1
        "111111111110000000",  # s1 .. s6
        "111111111110000000",
        "111111111110000000",
        "111111111110000000",
        "111111111110000000",
        "111111111110000000",
        "111111111111000000",  # D2
        "111111111111111110",  # <mask> x 5
        "111111111111111110",
        "111111111111111110",
        "111111111111111110",
        "111111111111111110",
        "111111111111111111",  # D3
    ])
    assert hybrid_attention_mask(layout).tolist() == expected
    # the Table 2 ablation: plain causal
    assert hybrid_attention_mask(layout, bidirectional=False).tolist() == torch.ones(18, 18, dtype=torch.bool).tril().tolist()


def test_mask_of_a_streamed_sequence_with_text_inserted_later():
    # Decoding y2 with q = 1, no prompt, l1 = 1, l2 = 2. The cache holds y1 y2 E D1 (first pass, 2
    # text tokens seen); this pass appends y3 (just arrived), the real s1, D2 again, 2 masks, D3.
    layout = Layout.cat([
        text_part(torch.tensor([9, 10]), 0),
        marker(E, 0, text_seen=2), marker(D, 1, text_seen=2, duration_of=0),
        text_part(torch.tensor([11]), 2),
        span_part(torch.tensor([18]), 2, text_seen=3, token=0),
        marker(D, 3, text_seen=3, duration_of=1),
        span_part(torch.tensor([M, M]), 4, text_seen=3, token=1),
        marker(D, 6, text_seen=3, duration_of=2),
    ])
    expected = matrix([
        "1000000000",  # y1
        "1100000000",  # y2
        "1110000000",  # E: y1 y2 (what had arrived), itself
        "1111000000",  # D1
        "1100100000",  # y3: text only, causal over text positions (not the speech before it)
        "1111110000",  # s1: all text, E, D1, itself
        "1111111000",  # D2
        "1111111110",  # mask: everything before, and both masks of y2
        "1111111110",
        "1111111111",  # D3
    ])
    assert hybrid_attention_mask(layout).tolist() == expected
    # rows for the new positions only (what a cached pass uses) are the same rows
    assert hybrid_attention_mask(layout, layout[4:]).tolist() == expected[4:]


@pytest.mark.parametrize("attention", ["hybrid", "causal"])
def test_decoder_table_mask_is_the_hybrid_mask(attention):
    """The decoding loop keeps its layout as a table and builds each pass's mask rows from per-query
    limits (_Decoder.attention_mask): the same booleans as hybrid_attention_mask over the Layout of
    the same parts, for the streamed example above and for random streams (text arriving between
    spans, empty spans, passes of one position)."""
    from arnar.paradigms.syncspeech import _Decoder

    net = model(attention=attention)
    bidirectional = attention == "hybrid"
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        decoder = _Decoder(net, cached=True, capacity=4)  # small: the table grows on the way
        parts, new = [], []
        text_pos, stream_pos, seen, token = 0, 0, 0, 0
        for _ in range(int(torch.randint(2, 9, (), generator=g))):
            for _ in range(int(torch.randint(1, 5, (), generator=g))):
                kind = int(torch.randint(3, (), generator=g))
                if kind == 0:  # text arrives
                    n = int(torch.randint(0, 3, (), generator=g))
                    ids = list(range(8, 8 + n))
                    decoder.add_text(ids, text_pos)
                    new.append(text_part(torch.tensor(ids, dtype=torch.long), text_pos))
                    text_pos, seen = text_pos + n, seen + n
                elif kind == 1:  # a span of speech or masks
                    n = int(torch.randint(0, 4, (), generator=g))
                    ids = [M] * n
                    decoder.add_span(ids, stream_pos, seen, token=token)
                    new.append(span_part(torch.tensor(ids, dtype=torch.long), stream_pos, seen, token=token))
                    stream_pos, token = stream_pos + n, token + 1
                else:
                    decoder.add_marker(D, stream_pos, seen)
                    new.append(marker(D, stream_pos, text_seen=seen))
                    stream_pos += 1
            n_new = sum(len(p) for p in new)
            if n_new == 0:
                continue
            start = decoder.length
            fresh = torch.tensor(decoder.pending, dtype=torch.long)
            keys = torch.cat([decoder.table[:, :start], fresh], dim=1)
            parts += new
            layout = Layout.cat(parts)
            expected = hybrid_attention_mask(layout, Layout.cat(new), bidirectional=bidirectional)
            assert _Decoder.attention_mask(keys, fresh).tolist() == expected.tolist()
            decoder.run()
            assert decoder.length == len(layout)
            assert torch.equal(decoder.table[:2, :decoder.length], torch.stack([layout.input_ids, layout.position_ids]))
            new = []


def test_pretrain_mask_rule_and_sequence():
    draws = [pretrain_text_mask(5, torch.Generator().manual_seed(s)) for s in range(40)]
    for mask in draws:
        assert all(a != b for a, b in zip(mask, mask[1:]))  # adjacent values differ
    firsts = [m[0] for m in draws]
    assert 10 <= sum(firsts) <= 30  # Bernoulli(0.5) first value
    layout, targets = pretrain_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, [True, False, True, False])
    # Eq. 6: all text, every span with its D, masked spans of y1 and y3, no trailing D
    assert layout.input_ids.tolist() == [9, 10, 11, 12, E, D, M, M, M, M, M, M, D, 24, 25, 26, 27, 28, D, M, M, D, 31]
    assert targets.tolist() == [X] * 6 + list(range(18, 24)) + [X] * 7 + [29, 30, X, X]
    assert layout.duration_of.tolist() == [-1] * 5 + [0] + [-1] * 6 + [1] + [-1] * 5 + [2, -1, -1, 3, -1]
    assert layout.text_seen[4:].eq(4).all()


def test_training_examples_targets_and_random_n():
    net = model(q=1)
    utt = paper_utterance()
    seen_n = set()
    for seed in range(40):
        ex = net.training_example(utt, torch.Generator().manual_seed(seed))
        n = int((ex.input_ids == D).sum()) - 1  # Eq. 3 has n + 1 D's
        seen_n.add(n)
        expected, _ = finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=n, q=1)
        assert ex.input_ids.tolist() == expected.input_ids.tolist()
        assert ex.attention_mask.tolist() == hybrid_attention_mask(expected).tolist()
        d_positions = (ex.input_ids == D).nonzero().flatten().tolist()
        dur = ex.extras["duration_targets"]
        # l = (6, 5, 2, 1): the last D predicts l_{n+1} (none for n = L), the one before the masks l_n
        l = [6, 5, 2, 1]
        assert dur[d_positions[-1]].item() == (l[n] if n < 4 else X)
        assert dur[d_positions[-2]].item() == l[n - 1]
        assert (dur != X).sum().item() == (2 if n < 4 else 1)
    assert seen_n == {1, 2, 3, 4}
    # Eq. 5 only (no prefill duration), and clamping at max_duration
    net = build_paradigm("syncspeech", VOCAB, TINY, max_duration=4, prefill_duration=False)
    for seed in range(20):
        ex = net.training_example(utt, torch.Generator().manual_seed(seed))
        n = int((ex.input_ids == D).sum()) - 1
        dur = ex.extras["duration_targets"]
        assert (dur != X).sum().item() == (1 if n < 4 else 0)
        if n == 1:
            assert dur[-1].item() == 4  # l_2 = 5 clamped to 4
    net = build_paradigm("syncspeech", VOCAB, TINY, max_duration=5, stage="pretrain")
    ex = net.training_example(utt, torch.Generator().manual_seed(0))
    assert ex.extras["duration_targets"][ex.input_ids == D].tolist() == [5, 5, 2, 1]  # every D; l_1 = 6 clamped
    assert ((ex.targets != X) == (ex.input_ids == M)).all()


def test_packed_finetune_sequence_hand_worked():
    """finetune_spans: all on two text tokens (ends 1, 3; q = 0): the real utterance, then a masked
    copy of each span that sees the text its decoding pass has read, the real stream before its span
    and itself. Rows worked out by hand from _ItemStream's passes."""
    text, speech, ends = torch.tensor([1, 2]), torch.tensor([5, 6, 7]), torch.tensor([1, 3])
    y1, y2, s1, s2, s3 = 9, 10, 23, 24, 25
    for bidirectional, copy1_rows, real_rows in (
        (True, ["1111110000110", "1111110000110"], ["1111111100000", "1111111100000"]),
        (False, ["1111110000100", "1111110000110"], ["1111111000000", "1111111100000"]),
    ):
        layout, targets, copy_of, mask = packed_finetune_sequence(VOCAB, text, speech, ends, q=0,
                                                                  bidirectional=bidirectional)
        #                y1  y2  E  D1  s1  D2  s2  s3 | M0 D'0 | M1a M1b D'1
        assert layout.input_ids.tolist() == [y1, y2, E, D, s1, D, s2, s3, M, D, M, M, D]
        assert layout.position_ids.tolist() == [0, 1, 0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 6]
        assert layout.text_seen.tolist() == [0, 0, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 2]
        assert copy_of.tolist() == [-1] * 8 + [0, 0, 1, 1, 1]
        assert layout.duration_of.tolist() == [-1, -1, -1, 0, -1, 1, -1, -1, -1, 1, -1, -1, 2]
        assert targets.tolist() == [X] * 8 + [s1, X, s2, s3, X]
        assert mask.tolist() == matrix([
            "1000000000000",  # y1
            "1100000000000",  # y2
            "1010000000000",  # E: the first q + 1 text tokens
            "1011000000000",  # D1
            "1111100000000",  # s1: entered at pass 2, y2 read
            "1111110000000",  # D2
            *real_rows,       # s2 s3: their span both ways (hybrid) or causally
            "1011000010000",  # M0: y1, the stream before span 1 (E, D1), itself
            "1011000011000",  # D'0: and the masks of its copy
            *copy1_rows,      # M1a M1b: y1 y2, E D1 s1 D2, their copy
            "1111110000111",  # D'1
        ])
    net = build_paradigm("syncspeech", VOCAB, TINY, max_duration=6, q=0, finetune_spans="all")
    utt = Utterance("u", "s", text, speech, ends)
    ex = net.training_example(utt, torch.Generator().manual_seed(0))
    assert len(ex.input_ids) == net.sequence_length(utt) == 13
    # l = (1, 2): D1 -> l_1 and D2 -> l_2 (prefill), D'0 -> l_2 (Eq. 5); D'1 has no next token
    assert ex.extras["duration_targets"].tolist() == [X, X, X, 1, X, 2, X, X, X, 2, X, X, X]
    net = build_paradigm("syncspeech", VOCAB, TINY, max_duration=6, q=0, finetune_spans="all", prefill_duration=False)
    assert net.training_example(utt, torch.Generator()).extras["duration_targets"].tolist() == [X] * 9 + [2, X, X, X]
    with pytest.raises(ValueError, match="finetune_spans"):
        build_paradigm("syncspeech", VOCAB, TINY, finetune_spans="some")


def test_input_noise_corrupts_the_spoken_spans_only():
    """input_noise (not in the paper): in fine-tuning a share of the real speech tokens the sequence
    reads is redrawn; the masks, text, markers, targets, positions and attention mask stay as they
    were, and pre-training (Eq. 6) is not touched."""
    speech = torch.arange(240) % 20  # 240 frames over 4 text tokens: the share replaced is measurable
    utt = Utterance("u", "s", PAPER_TEXT, speech, torch.tensor([60, 120, 180, 240]))
    for spans in ("all", "one"):
        clean = build_paradigm("syncspeech", VOCAB, TINY, finetune_spans=spans)
        noisy = build_paradigm("syncspeech", VOCAB, TINY, finetune_spans=spans, input_noise=0.5)
        a = clean.training_example(utt, torch.Generator().manual_seed(3))
        b = noisy.training_example(utt, torch.Generator().manual_seed(3))
        assert torch.equal(a.targets, b.targets) and torch.equal(a.position_ids, b.position_ids)
        assert torch.equal(a.attention_mask, b.attention_mask)
        assert torch.equal(a.extras["duration_targets"], b.extras["duration_targets"])
        spoken = VOCAB.is_speech(a.input_ids)
        assert torch.equal(a.input_ids[~spoken], b.input_ids[~spoken])  # text, E, D and <mask>
        assert bool(VOCAB.is_speech(b.input_ids[spoken]).all())
        if spans == "all":  # the real utterance is in the sequence: all 240 frames are read
            assert int(spoken.sum()) == 240
            # each redrawn with p = 0.5, landing on the same code with p = 1/20: 0.475 change (sd 0.032)
            assert 0.37 < float((a.input_ids[spoken] != b.input_ids[spoken]).float().mean()) < 0.58
        again = noisy.training_example(utt, torch.Generator().manual_seed(3))
        assert torch.equal(again.input_ids, b.input_ids)  # from the example's own generator
    pretrain = {"stage": "pretrain", "input_noise": 0.5}
    a = build_paradigm("syncspeech", VOCAB, TINY, stage="pretrain").training_example(utt, torch.Generator().manual_seed(1))
    b = build_paradigm("syncspeech", VOCAB, TINY, **pretrain).training_example(utt, torch.Generator().manual_seed(1))
    assert torch.equal(a.input_ids, b.input_ids)
    with pytest.raises(ValueError, match="input_noise"):
        build_paradigm("syncspeech", VOCAB, TINY, input_noise=1.0)


@pytest.mark.parametrize("attention", ["hybrid", "causal"])
def test_packed_finetuning_computes_what_decoding_computes(attention):
    """Fed the spans a cached streaming decoding produced, every copy of packed_finetune_sequence
    computes that decoding's hidden states: at its masks (the span's tokens) and at its D' (the next
    duration), and D_1 those of the first pass. So the packed layout is the decoding, teacher-forced,
    with q smaller than the text (text arriving while speech is spoken)."""
    net = model(q=1, attention=attention)
    text, ends = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([3, 3, 5, 8, 9])
    no_prompt = torch.zeros(0, dtype=torch.long)
    passes = []  # hidden states of each pass's new positions
    hook = net.backbone.register_forward_hook(lambda _m, _args, output: passes.append(output[0]))
    try:
        out = net.generate(SynthesisRequest(text, no_prompt, no_prompt, text_ends=ends), torch.Generator())
    finally:
        hook.remove()
    assert len(passes) == len(text) + 1 and len(set(out.speech.tolist())) > 2
    layout, _, copy_of, mask = packed_finetune_sequence(VOCAB, text, out.speech, ends, q=1,
                                                        bidirectional=attention == "hybrid")
    with torch.no_grad():
        hidden = net.backbone(net.embed(layout.input_ids[None]), layout.position_ids[None], mask[None])[0]
    first_d = int(((layout.input_ids == D) & (copy_of < 0)).nonzero()[0])
    torch.testing.assert_close(hidden[first_d], passes[0][-1], atol=1e-4, rtol=1e-4)
    for n, decoded in enumerate(passes[1:]):
        span = int(ends[n] - (ends[n - 1] if n else 0))
        # a pass's new positions end with the masks of span n and the D' after them
        torch.testing.assert_close(hidden[copy_of == n], decoded[len(decoded) - span - 1:], atol=1e-4, rtol=1e-4)
    logits = net.head(hidden)
    logits[:, : VOCAB.speech_offset] = -math.inf
    assert (logits[layout.input_ids == M].argmax(-1) - VOCAB.speech_offset).tolist() == out.speech.tolist()


def test_loss_is_sum_over_speech_and_duration_targets_with_padding():
    net = model(q=1)
    utt = paper_utterance()
    short = Utterance("spk00_0002", "spk00", torch.tensor([5, 6]), torch.tensor([3, 4, 5]), torch.tensor([1, 3]))
    examples = [net.training_example(utt, torch.Generator().manual_seed(3)),
                net.training_example(short, torch.Generator().manual_seed(1))]
    out = net(collate(examples))
    total, count = 0.0, 0
    for ex in examples:  # one at a time, by hand: shared head on the speech targets, duration head on D's
        hidden = net.backbone(net.embed(ex.input_ids[None]), ex.position_ids[None], ex.attention_mask[None])[0]
        keep = ex.targets != X
        total += torch.nn.functional.cross_entropy(net.head(hidden[keep]), ex.targets[keep], reduction="sum").item()
        dur = ex.extras["duration_targets"]
        keep_d = dur != X
        total += torch.nn.functional.cross_entropy(net.duration_head(hidden[keep_d]), dur[keep_d], reduction="sum").item()
        count += int(keep.sum() + keep_d.sum())
    assert int(out.n_targets) == count  # the zero-padded duration extras add no targets
    assert out.loss_sum.item() == pytest.approx(total, rel=1e-5)
    out.loss_sum.backward()
    assert net.duration_head.weight.grad.abs().sum() > 0 and net.head.weight.grad.abs().sum() > 0


def test_options_and_configs():
    from arnar.train import compose_config

    for name, stage in (("syncspeech", "finetune"), ("syncspeech_pretrain", "pretrain")):
        cfg = compose_config([f"paradigm={name}", "model=tiny"])
        assert cfg.paradigm.name == "syncspeech" and cfg.paradigm.options.stage == stage
        net = build_paradigm(cfg.paradigm.name, VOCAB, TINY, **cfg.paradigm.options)
        assert net.duration_head.out_features == cfg.paradigm.options.max_duration + 1
    with pytest.raises(ValueError, match="unknown options"):
        build_paradigm("syncspeech", VOCAB, TINY, lookahead=2)
    with pytest.raises(ValueError, match="attention"):
        build_paradigm("syncspeech", VOCAB, TINY, attention="full")
    with pytest.raises(ValueError, match="alignment"):
        build_paradigm("syncspeech", VOCAB, TINY).training_example(
            Utterance("u", "s", torch.tensor([1]), torch.tensor([1, 2])), torch.Generator())


def test_finetuning_starts_from_the_pretrained_network(tmp_path):
    """train.init_from (SyncSpeech, arXiv:2502.11094, Sec. 2.1: pre-training, then fine-tuning): the two stages' configs
    differ only in ``stage``, so the pre-trained state dict fits the fine-tuning model exactly,
    duration head and the E / D embeddings included; loaded, the fine-tuning model computes what the
    pre-trained one does. A duration head of another size is refused by name."""
    from omegaconf import OmegaConf

    from arnar.train import Distributed, TrainError, _init_from, compose_config

    pre, fine = (OmegaConf.to_container(compose_config([f"paradigm={name}", "model=tiny"]).paradigm.options)
                 for name in ("syncspeech_pretrain", "syncspeech"))
    assert pre.pop("stage") == "pretrain" and fine.pop("stage") == "finetune"
    assert pre == fine
    torch.manual_seed(1)
    pretrained = build_paradigm("syncspeech", VOCAB, TINY, stage="pretrain", **pre).eval()
    with torch.no_grad():
        for weight in pretrained.parameters():
            weight.normal_(std=0.5)
    torch.save({"model": pretrained.state_dict(), "vocab": VOCAB.to_dict(), "step": 7, "paradigm": "syncspeech"},
               tmp_path / "final.pt")
    torch.manual_seed(2)
    finetuned = build_paradigm("syncspeech", VOCAB, TINY, stage="finetune", **fine).eval()
    assert not torch.equal(finetuned.embed.weight[[E, D]], pretrained.embed.weight[[E, D]])
    _init_from(finetuned, tmp_path, VOCAB, Distributed())
    loaded, saved = finetuned.state_dict(), pretrained.state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    layout, _ = finetune_sequence(VOCAB, PAPER_TEXT, PAPER_SPEECH, PAPER_ENDS, n=2, q=1)
    mask = hybrid_attention_mask(layout)[None]
    with torch.no_grad():
        hidden = [net.backbone(net.embed(layout.input_ids[None]), layout.position_ids[None], mask)[0]
                  for net in (pretrained, finetuned)]
        assert torch.equal(pretrained.duration_head(hidden[0]), finetuned.duration_head(hidden[1]))
        assert torch.equal(pretrained.head(hidden[0]), finetuned.head(hidden[1]))
    other = build_paradigm("syncspeech", VOCAB, TINY, **{**fine, "max_duration": fine["max_duration"] + 1})
    with pytest.raises(TrainError, match="does not fit"):
        _init_from(other, tmp_path, VOCAB, Distributed())


# ----------------------------------------------------------------------------- decoding

def test_uniform_prompt_ends_and_durations():
    assert uniform_ends(3, 10).tolist() == [3, 6, 10]
    assert uniform_ends(4, 2).tolist() == [0, 1, 1, 2]
    assert durations(torch.tensor([6, 11, 13, 14])).tolist() == [6, 5, 2, 1]
    with pytest.raises(ValueError):
        uniform_ends(0, 5)


REQUEST = SynthesisRequest(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7]), torch.tensor([1, 2, 3, 4, 5]))


@pytest.mark.parametrize("options", [{}, {"q": 2, "attention": "causal"}])
def test_forward_passes_are_L_plus_1_and_cached_equals_uncached(options):
    net = model(**options)
    outs = []
    for cached in (True, False):
        with ForwardPassCounter(net.backbone) as counter:
            out = net.generate(REQUEST, torch.Generator().manual_seed(1), cached=cached, speech_top_k=3)
        assert counter.count == out.forward_passes == len(REQUEST.text) + 1
        outs.append(out)
    assert torch.equal(outs[0].speech, outs[1].speech) and len(outs[0].speech) > 0
    assert ((outs[0].speech >= 0) & (outs[0].speech < VOCAB.speech_size)).all()
    again = net.generate(REQUEST, torch.Generator().manual_seed(1), speech_top_k=3)
    assert torch.equal(again.speech, outs[0].speech)  # reproducible from the seed


def test_each_decoding_pass_is_fed_the_training_sequence():
    """Uncached, pass n sees exactly Eq. 3 for n (text up to n + q, the generated spans as the real
    ones, masks for y_n), whatever order the text was inserted in."""
    net = model(q=1)
    calls = []
    hook = net.backbone.register_forward_pre_hook(lambda _m, args: calls.append((args[0][0], args[1][0])))
    request = SynthesisRequest(torch.tensor([1, 2, 3, 4]), torch.zeros(0, dtype=torch.long),
                               torch.zeros(0, dtype=torch.long), text_ends=torch.tensor([2, 2, 5, 6]))
    try:
        out = net.generate(request, torch.Generator().manual_seed(0), cached=False)
    finally:
        hook.remove()
    assert len(out.speech) == 6 and out.info["durations_from"] == "oracle"
    embeddings = net.embed.weight
    for n in range(1, 5):
        x, positions = calls[n]
        ids = (x[:, None, :] == embeddings[None]).all(-1).float().argmax(-1)  # embedding rows back to ids
        is_text = (ids >= VOCAB.text_offset) & (ids < VOCAB.speech_offset)
        expected, _ = finetune_sequence(VOCAB, request.text, out.speech, request.text_ends, n=n, q=1)
        # text in text-position order, then the speech stream in stream order
        for got, want in ((is_text, expected.is_text), (~is_text, ~expected.is_text)):
            order = positions[got].argsort()
            assert ids[got][order].tolist() == expected.input_ids[want].tolist()
            assert positions[got][order].tolist() == expected.position_ids[want].tolist()


@pytest.mark.parametrize("attention", ["hybrid", "causal"])
def test_greedy_tokens_are_the_training_forward_argmax_when_all_text_is_seen(attention):
    """With q >= L every position sees the whole text from the first pass, so streaming attention is
    training attention: each generated span must be the argmax, over speech ids, of a plain forward
    of Eq. 3 at its masks, and each sampled-free duration the argmax of the duration head at the last D."""
    net = model(q=4, attention=attention)
    bidirectional = attention == "hybrid"
    text, ends = torch.tensor([1, 2, 3, 4]), torch.tensor([3, 3, 5, 8])
    out = net.generate(SynthesisRequest(text, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                                        text_ends=ends), torch.Generator())
    assert len(out.speech) == 8
    spans = [out.speech[a:b].tolist() for a, b in zip([0, 3, 3, 5], [3, 3, 5, 8])]
    assert any(span != span[::-1] for span in spans)  # order inside a span is visible to this test
    for n in range(1, 5):
        layout, _ = finetune_sequence(VOCAB, text, out.speech, ends, n=n, q=4)
        with torch.no_grad():
            logits = net.logits(layout.input_ids[None], layout.position_ids[None],
                                hybrid_attention_mask(layout, bidirectional=bidirectional)[None])[0]
        logits[:, : VOCAB.speech_offset] = -math.inf
        masks = layout.input_ids == M
        start = int(ends[n - 2]) if n > 1 else 0
        assert (logits[masks].argmax(-1) - VOCAB.speech_offset).tolist() == out.speech[start:int(ends[n - 1])].tolist()
    # predicted durations: greedy ones are the duration head's argmax at the last D of Eq. 3
    predicted = [step.next_duration for step in net.stream(text.tolist(), torch.zeros(0, dtype=torch.long),
                                                           torch.zeros(0, dtype=torch.long), torch.Generator(),
                                                           text_ends=ends, duration_top_k=1)]
    assert predicted == [3, 0, 2, 3, 0]  # the oracle's, then nothing after the last token
    free = list(net.stream(text.tolist(), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                           torch.Generator(), duration_top_k=1))
    spoken = torch.cat([s.speech for s in free])
    free_ends = torch.tensor([s.next_duration for s in free[:-1]]).cumsum(0)
    for n in range(1, 4):
        layout, _ = finetune_sequence(VOCAB, text, spoken, free_ends, n=n, q=4)
        with torch.no_grad():
            hidden = net.backbone(net.embed(layout.input_ids[None]), layout.position_ids[None],
                                  hybrid_attention_mask(layout, bidirectional=bidirectional)[None])[0]
        assert int(net.duration_head(hidden[-1]).argmax()) == free[n].next_duration


def test_streaming_starts_after_q_plus_1_tokens_and_reads_one_per_pass():
    for q in (1, 2):
        net = model(q=q)
        pulled = []

        def text():
            for token in [1, 2, 3, 4, 5]:
                pulled.append(token)
                yield token

        steps = net.stream(text(), torch.tensor([6]), torch.tensor([1, 2]), torch.Generator().manual_seed(0))
        first = next(steps)
        assert len(pulled) == q + 1 and first.text_tokens_read == q + 1 and len(first.speech) == 0
        assert first.forward_passes == 1
        for n, step in enumerate(steps, start=1):
            assert step.text_tokens_read == min(5, n + q) == len(pulled)
            assert step.forward_passes == n + 1
        assert n == 5
    # fewer tokens than q + 1: it starts when the text ends
    net = model(q=2)
    steps = list(net.stream(iter([3]), torch.tensor([6]), torch.tensor([1]), torch.Generator()))
    assert [s.text_tokens_read for s in steps] == [1, 1] and steps[-1].forward_passes == 2


class SimulatedTime:
    """A clock that moves only when told: ``pass_seconds`` per backbone call (a forward hook on
    ``net``), and by what ``sleep`` is asked to wait. Latencies measured on it are exact."""

    def __init__(self, net, pass_seconds: float):
        self.now = 0.0
        self.pass_seconds = pass_seconds
        self.hook = net.backbone.register_forward_hook(lambda *_: self.sleep(self.pass_seconds))

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.hook.remove()


def test_first_packet_info_with_oracle_durations(monkeypatch):
    import types

    import arnar.paradigms.syncspeech as syncspeech

    net = model(q=1)
    request = SynthesisRequest(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6]), torch.tensor([1, 2, 3]),
                               text_ends=torch.tensor([2, 4, 6, 8, 10]))
    with SimulatedTime(net, pass_seconds=0.01) as simulated:  # 10 ms a pass: d_TTS = 0.01
        monkeypatch.setattr(syncspeech, "time", types.SimpleNamespace(perf_counter=simulated.clock))
        out = net.generate(request, torch.Generator().manual_seed(0), chunk_size=5)
    # 2 frames per pass: 5 tokens exist after the third speech pass (pass 4 with the first),
    # which needed y_{3+q} = y4; the first pass needed y1, y2 (q + 1)
    assert len(out.speech) == 10 and out.forward_passes == 6
    assert out.first_packet_passes == 4
    assert out.info["text_tokens_to_start"] == 2 and out.info["text_tokens_waited"] == 4
    assert out.info["chunk_size"] == 5 and out.info["prompt_ends"] == "uniform"
    # FPL-A: c = 4 passes of 10 ms
    assert out.info["first_packet_seconds"] == pytest.approx(0.04)
    # Eq. 7 at d_LLM = 25 ms: (q + 1) x 0.025 + c x 0.01 = 0.05 + 0.04 = 0.09, as the evaluation
    # computes it from the record (text_tokens_to_start x d_LLM + FPL-A); the waited figure
    # 4 x 0.025 + 0.04 = 0.14
    assert syncspeech_fpl_l(q=1, c=out.first_packet_passes, d_tts=0.01) == pytest.approx(0.09)
    assert fpl_l(out.info["first_packet_seconds"], out.info["text_tokens_to_start"]) == pytest.approx(0.09)
    assert fpl_l(out.info["first_packet_seconds"], out.info["text_tokens_waited"]) == pytest.approx(0.14)
    # q = 2 starts after 3 tokens; a text shorter than q + 1 starts when it ends
    assert model(q=2).generate(request, torch.Generator(), chunk_size=5).info["text_tokens_to_start"] == 3
    short = SynthesisRequest(torch.tensor([1]), torch.tensor([6]), torch.tensor([1, 2, 3]), text_ends=torch.tensor([2]))
    assert model(q=2).generate(short, torch.Generator(), chunk_size=5).info["text_tokens_to_start"] == 1


def test_prompt_ends_from_the_request_split_the_prompt_speech():
    """``request.features["prompt_ends"]`` (the prompt's alignment) decides which prompt frames
    follow which D of the first pass; without it they are spread uniformly. Prompt text (6, 7) ->
    ids 14, 15; target y1 y2 -> 9, 10 (q = 1); prompt codes 1..5 -> ids 19..23."""
    net = model(q=1)
    firsts = []
    hook = net.backbone.register_forward_pre_hook(lambda _m, args: firsts.append(args[0][0]) if not firsts else None)

    def first_pass_ids(**features):
        firsts.clear()
        request = SynthesisRequest(torch.tensor([1, 2, 3]), torch.tensor([6, 7]), torch.tensor([1, 2, 3, 4, 5]),
                                   features=features)
        out = net.generate(request, torch.Generator().manual_seed(0), cached=False)
        x = firsts[0]
        return (x[:, None, :] == net.embed.weight[None]).all(-1).float().argmax(-1).tolist(), out.info

    try:
        ids, info = first_pass_ids(prompt_ends=torch.tensor([1, 5]))  # the aligner: "6" is one frame, "7" four
        assert ids == [14, 15, 9, 10, E, D, 19, D, 20, 21, 22, 23, D] and info["prompt_ends"] == "aligned"
        ids, info = first_pass_ids()  # uniform: floor(k * 5 / 2) = 2, 5
        assert ids == [14, 15, 9, 10, E, D, 19, 20, D, 21, 22, 23, D] and info["prompt_ends"] == "uniform"
        with pytest.raises(ValueError, match="prompt"):  # ends that are not the prompt's frames
            first_pass_ids(prompt_ends=torch.tensor([1, 4]))
    finally:
        hook.remove()


def fixed_duration_head(net, probabilities: list[float]) -> None:
    """The duration head outputs log ``probabilities`` (classes 0..max_duration) whatever it sees."""
    with torch.no_grad():
        net.duration_head.weight.zero_()
        net.duration_head.bias.copy_(torch.tensor(probabilities).log())


def test_durations_are_sampled_among_the_top_k():
    """Table 3: durations sampled among the 3 most likely (renormalised), speech greedy. A head that
    says 0.5, 0.3, 0.2 for durations 2, 3, 4 and 0.1 in all for the other four: top-3 draws are
    2, 3, 4 at 0.5 / 0.3 / 0.2; greedy is always 2; without the top-k cut the others come too."""
    net = model(q=1)
    fixed_duration_head(net, [0.01, 0.04, 0.5, 0.3, 0.2, 0.03, 0.02])
    prompt_text, prompt_speech = torch.tensor([6]), torch.tensor([1, 2])

    def first_durations(n: int, **decoding) -> list[int]:
        return [next(net.stream([1, 2, 3], prompt_text, prompt_speech, torch.Generator().manual_seed(seed),
                                **decoding)).next_duration for seed in range(n)]

    draws = first_durations(400)  # the default, duration_top_k = 3
    counts = {d: draws.count(d) for d in set(draws)}
    assert set(counts) == {2, 3, 4}
    # binomial sd at n = 400: 0.025 (p = 0.5), 0.023 (0.3), 0.02 (0.2); 3 sd either side
    assert counts[2] / 400 == pytest.approx(0.5, abs=0.075)
    assert counts[3] / 400 == pytest.approx(0.3, abs=0.07)
    assert counts[4] / 400 == pytest.approx(0.2, abs=0.06)
    assert set(first_durations(20, duration_top_k=1)) == {2}
    assert set(first_durations(200, duration_top_k=7)) & {0, 1, 5, 6}  # p = 0.1 / 1.1 each draw
    # each drawn duration is the length of the span the next pass speaks
    steps = list(net.stream([1, 2, 3, 4, 5], prompt_text, prompt_speech, torch.Generator().manual_seed(5)))
    assert [len(s.speech) for s in steps[1:]] == [s.next_duration for s in steps[:-1]]
    assert len({s.next_duration for s in steps[:-1]}) > 1  # sampled, not one value throughout


def test_speech_chunks_regroup_spans():
    steps = [StreamStep(torch.zeros(0, dtype=torch.long), 2, 1, 3),
             StreamStep(torch.tensor([1, 2, 3]), 3, 2, 4),
             StreamStep(torch.tensor([4, 5, 6, 7]), 4, 3, 0),
             StreamStep(torch.tensor([8]), 4, 4, 0)]
    chunks = list(speech_chunks(steps, 2))
    assert [c.speech.tolist() for c in chunks] == [[1, 2], [3, 4], [5, 6], [7, 8], []]
    assert [(c.text_tokens_read, c.forward_passes, c.last) for c in chunks] == [
        (3, 2, False), (4, 3, False), (4, 3, False), (4, 4, False), (4, 4, True)]
    # a span longer than two chunks, and a stream whose spans end exactly on a chunk
    steps = [StreamStep(torch.arange(5), 1, 1, 0), StreamStep(torch.arange(5, 6), 2, 2, 0)]
    assert [c.speech.tolist() for c in speech_chunks(steps, 2)] == [[0, 1], [2, 3], [4, 5], []]
    assert [c.speech.tolist() for c in speech_chunks([], 2)] == []


# ----------------------------------------------------------------------------- arnar stream (token level)

def test_words_are_released_only_when_complete():
    assert list(words(io.StringIO("  hello big\n\tworld"))) == ["hello", "big", "world"]
    assert list(bpe_tokens(["ab", "c"], lambda w: [ord(ch) for ch in w])) == [97, 98, 99]


def test_upstream_releases_token_k_at_k_times_d_llm():
    now = [0.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    upstream = Upstream([5, 6, 7], 0.025, clock=lambda: now[0], sleep=sleep)
    upstream.start()
    assert list(upstream) == [5, 6, 7]
    assert upstream.arrivals == pytest.approx([0.025, 0.05, 0.075])


def test_run_stream_matches_generate_and_waits_for_the_upstream():
    net = model(q=1)
    text = [1, 2, 3, 4, 5, 1, 2]
    prompt_text, prompt_speech = torch.tensor([6, 7]), torch.tensor([1, 2, 3, 4])
    seen = []
    streamed = run_stream(net, iter(text), prompt_text, prompt_speech, seed=3, d_llm=0.02,
                          decoding={"chunk_size": 4}, on_chunk=lambda chunk, ready: seen.append(len(chunk.speech)))
    reference = net.generate(SynthesisRequest(torch.tensor(text), prompt_text, prompt_speech),
                             torch.Generator().manual_seed(3), chunk_size=4)
    assert torch.equal(streamed["codes"], reference.speech)
    assert streamed["forward_passes"] == len(text) + 1 and streamed["received"] == text
    assert streamed["text_tokens_waited"] == reference.info["text_tokens_waited"] >= 2
    # the first packet cannot exist before its text did
    assert streamed["first_packet_seconds"] >= streamed["text_tokens_waited"] * 0.02
    assert all(size == 4 for size in seen[:-1]) and sum(seen) == len(reference.speech)


@pytest.mark.parametrize("d_llm, measured, eq7, waited", [
    # upstream faster than the model: every later token is there before the pass that needs it
    (0.02, 0.13, 0.13, 0.15),
    # upstream slower: pass 3 waits for y3 (0.3 s), so the measurement lies between Eq. 7 and waited
    (0.1, 0.33, 0.29, 0.39),
])
def test_stream_latencies_hand_worked(d_llm, measured, eq7, waited):
    """A simulated clock (30 ms a pass, the upstream's token k at k x d_LLM) and a duration head that
    always says 2: with chunk_size 4 the first packet is spans 1 and 2, so c = 3 passes (the first
    pass and two speech passes) and the pass for y2 read y3 (q = 1): 3 text tokens waited.
    FPL-A = 3 x 0.03 = 0.09. d_LLM = 0.02: y2 at 0.04, passes end at 0.07, 0.10, 0.13 (y3 came at
    0.06). d_LLM = 0.1: y2 at 0.2, passes end at 0.23, 0.26; y3 at 0.3, the pass ends at 0.33.
    Eq. 7 = 2 d_LLM + 0.09; waited = 3 d_LLM + 0.09."""
    net = model(q=1)
    fixed_duration_head(net, [1e-6, 1e-6, 1.0, 1e-6, 1e-6, 1e-6, 1e-6])
    text = [1, 2, 3, 4, 5, 1, 2]
    prompt_text, prompt_speech = torch.tensor([6, 7]), torch.tensor([1, 2, 3, 4])
    with SimulatedTime(net, pass_seconds=0.03) as simulated:
        streamed = run_stream(net, iter(text), prompt_text, prompt_speech, seed=3, d_llm=d_llm,
                              decoding={"chunk_size": 4}, clock=simulated.clock, sleep=simulated.sleep)
    with SimulatedTime(net, pass_seconds=0.03) as simulated:
        fpl_a_run = run_stream(net, text, prompt_text, prompt_speech, seed=3, decoding={"chunk_size": 4},
                               stop_after_first=True, clock=simulated.clock, sleep=simulated.sleep)
    assert streamed["first_packet_passes"] == fpl_a_run["first_packet_passes"] == 3
    assert streamed["text_tokens_waited"] == 3
    assert fpl_a_run["first_packet_seconds"] == pytest.approx(0.09)
    report = latency_summary(streamed, fpl_a_run, q=1, d_llm=d_llm)
    assert report["c"] == 3 and report["d_tts"] == pytest.approx(0.03)
    assert report["fpl_a_measured"] == pytest.approx(0.09)
    assert report["fpl_l_measured"] == pytest.approx(measured)
    assert report["fpl_l_eq7"] == pytest.approx(eq7)
    assert report["fpl_l_waited"] == pytest.approx(waited)
