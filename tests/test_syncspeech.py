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
from arnar.paradigms.base import IGNORE, MASK, N_SPECIAL, SPECIAL_NAMES, SynthesisRequest, Utterance, Vocab, collate
from arnar.paradigms.syncspeech import (
    DURATION,
    END_OF_TEXT,
    Layout,
    StreamStep,
    durations,
    finetune_sequence,
    hybrid_attention_mask,
    marker,
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

def test_markers_use_the_spare_special_ids():
    assert (END_OF_TEXT, DURATION) == (6, 7)
    assert SPECIAL_NAMES[6] == "<spare6>" and SPECIAL_NAMES[7] == "<spare7>" and N_SPECIAL == 8


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


def test_first_packet_info_with_oracle_durations():
    net = model(q=1)
    request = SynthesisRequest(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6]), torch.tensor([1, 2, 3]),
                               text_ends=torch.tensor([2, 4, 6, 8, 10]))
    out = net.generate(request, torch.Generator().manual_seed(0), chunk_size=5)
    # 2 frames per pass: 5 tokens exist after the third speech pass (pass 4 with the first),
    # which needed y_{3+q} = y4
    assert len(out.speech) == 10 and out.forward_passes == 6
    assert out.first_packet_passes == 4
    assert out.info["text_tokens_waited"] == 4 and out.info["chunk_size"] == 5
    assert 0 < out.info["first_packet_seconds"]
    assert syncspeech_fpl_l(1, 4, 0.01) == pytest.approx(2 * 0.025 + 4 * 0.01)  # Eq. 7 for this run


def test_speech_chunks_regroup_spans():
    steps = [StreamStep(torch.zeros(0, dtype=torch.long), 2, 1, 3),
             StreamStep(torch.tensor([1, 2, 3]), 3, 2, 4),
             StreamStep(torch.tensor([4, 5, 6, 7]), 4, 3, 0),
             StreamStep(torch.tensor([8]), 4, 4, 0)]
    chunks = list(speech_chunks(steps, 2))
    assert [c.speech.tolist() for c in chunks] == [[1, 2], [3, 4], [5, 6], [7, 8], []]
    assert [(c.text_tokens_read, c.forward_passes, c.last) for c in chunks] == [
        (3, 2, False), (4, 3, False), (4, 3, False), (4, 4, False), (4, 4, True)]


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
    fpl_a_run = run_stream(net, text, prompt_text, prompt_speech, seed=3, decoding={"chunk_size": 4},
                           stop_after_first=True)
    assert fpl_a_run["first_packet_passes"] == streamed["first_packet_passes"]
    report = latency_summary(streamed, fpl_a_run, q=1, d_llm=0.02)
    c, fpl_a = report["c"], report["fpl_a_measured"]
    assert report["fpl_l_eq7"] == pytest.approx(2 * 0.02 + c * (fpl_a / c))
    assert report["fpl_l_waited"] == pytest.approx(fpl_l(fpl_a, streamed["text_tokens_waited"], 0.02))
    assert math.isfinite(report["fpl_l_measured"])
