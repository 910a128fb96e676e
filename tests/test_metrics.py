"""Metric math of the evaluation protocol, against hand-worked examples."""

import math

import numpy as np
import pytest
import torch

from arnar.evaluate.metrics import (
    ForwardPassCounter,
    WordErrors,
    fpl_l,
    iterations_to_first_chunk,
    normalize_for_wer,
    real_time_factor,
    summarize_wer,
    syncspeech_fpl_l,
    verification_separation,
    word_errors,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello, World!", "hello world"),
        ("It's 42 degrees.", "it's forty two degrees"),
        ("The 21st of May: 1,000 people", "the twenty first of may one thousand people"),
        ("3.05 m", "three point zero five m"),
        ("Agent 007", "agent zero zero seven"),
        ("well-known \u2014 rock/roll", "well known rock roll"),
        ("\u201cQuoted\u201d \u2018single\u2019 don\u2019t", "quoted single don't"),
        ("  CAF\u00c9   2nd  ", "caf\u00e9 second"),
        ("an mp3 file", "an mp3 file"),  # digits inside a word are left as written
        # past the cardinals (10**15): digit by digit, as a transcript of babble reads ("7777...")
        ("1" + "7" * 20 + " says", " ".join(["one"] + ["seven"] * 20 + ["says"])),
        ("999,999,999,999,999", "nine hundred ninety nine trillion nine hundred ninety nine billion nine hundred "
                                "ninety nine million nine hundred ninety nine thousand nine hundred ninety nine"),
    ],
)
def test_normalizer(text, expected):
    assert normalize_for_wer(text) == expected


def test_wer_substitution_and_deletion():
    # ref: the cat sat on the mat (6 words); hyp: the cat sit on mat -> sat->sit (S), "the" (D)
    e = word_errors("The cat sat on the mat.", "the cat sit on mat")
    assert (e.ref_words, e.substitutions, e.deletions, e.insertions) == (6, 1, 1, 0)
    assert e.wer == pytest.approx(2 / 6)


def test_wer_empty_hypothesis_deletes_every_word():
    e = word_errors("one two three", "")
    assert (e.deletions, e.errors, e.wer) == (3, 3, 1.0)
    assert word_errors("one two three", " ... ").wer == 1.0  # punctuation only normalises to empty


def test_wer_insertions_can_exceed_one():
    e = word_errors("hello", "hello there my friend")
    assert (e.insertions, e.wer) == (3, 3.0)


def test_wer_normalisation_applies_to_both_sides():
    assert word_errors("It costs 5 dollars!", "it costs five dollars").errors == 0


def test_wer_empty_reference_is_an_error():
    with pytest.raises(ValueError, match="WER is undefined"):
        word_errors(" !? ", "anything")


def test_two_wer_conventions():
    # utterance 1: 2 reference words, 1 error -> 50 %; utterance 2: 8 words, 0 errors -> 0 %
    # mean of per-utterance WER (Seed-TTS) = 25 %; corpus WER (PALLE) = 1 / 10 = 10 %
    summary = summarize_wer([WordErrors(2, 1, 0, 0), WordErrors(8, 0, 0, 0)])
    assert summary["wer_utterance_mean"] == pytest.approx(25.0)
    assert summary["wer_corpus"] == pytest.approx(10.0)
    assert (summary["ref_words"], summary["substitutions"]) == (10, 1)


def test_fpl_eq7_worked_numbers():
    # q = 1 look-ahead token, d_LLM = 25 ms, c = 3 iterations of d_TTS = 40 ms:
    # (1 + 1) * 0.025 + 3 * 0.040 = 0.05 + 0.12 = 0.17 s
    assert syncspeech_fpl_l(q=1, c=3, d_tts=0.040) == pytest.approx(0.17)
    # FPL-A drops the first term
    assert syncspeech_fpl_l(q=1, c=3, d_tts=0.040, d_llm=0.0) == pytest.approx(0.12)
    # an AR model that needs the whole 20-token text before its first packet of 0.3 s
    assert fpl_l(0.3, text_tokens_waited=20) == pytest.approx(0.8)


def test_iterations_to_first_chunk():
    # chunk size 15 (SyncSpeech); tokens per step 6, 5, 7 -> cumulative 6, 11, 18 -> c = 3
    assert iterations_to_first_chunk([6, 5, 7, 9], chunk_size=15) == 3
    assert iterations_to_first_chunk([15], chunk_size=15) == 1
    with pytest.raises(ValueError, match="never reaching"):
        iterations_to_first_chunk([3, 4], chunk_size=15)


def test_rtf():
    assert real_time_factor(2.0, 8.0) == 0.25
    with pytest.raises(ValueError):
        real_time_factor(1.0, 0.0)


def test_verification_separation_worked_example():
    # pairs (same > other): 0.9>0.7, 0.9>0.85, 0.8>0.7, 0.8<0.85 -> AUC 3/4
    # at threshold 0.85: false rejects {0.8} = 1/2, false accepts {0.85} = 1/2 -> EER 0.5
    result = verification_separation([0.9, 0.8], [0.7, 0.85])
    assert result["auc"] == pytest.approx(0.75)
    assert result["eer"] == pytest.approx(0.5)
    perfect = verification_separation([0.9, 0.95], [0.1, 0.2, 0.3])
    assert (perfect["auc"], perfect["eer"]) == (1.0, 0.0)
    assert verification_separation([0.5], [0.5])["auc"] == 0.5  # a tie counts one half


def test_forward_pass_counter_counts_top_level_calls_only():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.zeros(1, 4)
    with ForwardPassCounter(model) as passes:
        for _ in range(3):
            model(x)
    assert passes.count == 3
    model(x)
    assert passes.count == 3  # the hook is gone after the block
