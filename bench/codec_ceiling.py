"""What caps the single-stream codec: its tokens or its decoder (issue 20), per test item.

    python bench/codec_ceiling.py --codec-model data/mini/codec/offline \
        --testlist data/mini/eval/testlists/cross_sentence.tsv \
        --targets data/mini/systems/ground_truth/cross_sentence \
        --prompts data/mini/eval/prompts/cross_sentence \
        --alignments data/mini/align/pocketsphinx/test.jsonl --out /tmp/ceiling

Writes three systems (folders of <item_id>.wav) that differ only in the 25 Hz tokens the same
decoder gets, for the test targets of a list, each decoded with the item's prompt:

``tokens``       the codec's own tokens (what ``resynth_offline`` is);
``phone_fixed``  the same tokens, except that where the phone encoder's argmax phone differs from
                 the aligner's phone label of the frame, the token is replaced by the commonest
                 token of the labelled phone (counted over the frames of these targets that the
                 encoder gets right), so only the encoder's phone errors are repaired;
``phone_only``   every frame's token is its labelled phone's commonest token: phone identity and
                 timing only, no detail within a phone (what a decoder can do from phones alone).

Score them with ``arnar evaluate ... --corpus`` (WER per voice group). tokens -> phone_fixed is
what the encoder's phone errors cost; phone_fixed -> ground truth is what the decoder (and
Griffin-Lim) cost. It also prints the encoder's frame phone accuracy per voice.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from arnar.codec.offline import (
    HOP,
    SEMANTIC_STACK,
    OfflineCodec,
    _assign,
    _frame_labels,
    _phone_key,
    _read_alignments,
    log_mel,
)
from arnar.evaluate.audio import load_mono
from arnar.evaluate.run import read_voice_groups
from arnar.evaluate.testlists import read_testlist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec-model", required=True)
    ap.add_argument("--testlist", required=True)
    ap.add_argument("--targets", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--alignments", required=True, help="the aligner's phone JSONL of the test split")
    ap.add_argument("--corpus", help="corpus folder (speakers.tsv) for accuracy per voice")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    codec = OfflineCodec(args.codec_model, threads=1)
    phones = codec.cfg["phones"]
    index = {p: i for i, p in enumerate(phones)}
    align = _read_alignments(Path(args.alignments))
    voices = read_voice_groups(Path(args.corpus)) if args.corpus else {}
    items = [i for i in read_testlist(Path(args.testlist)) if i.target_id in align]

    rows = []  # per item: audio, prompt, tokens, predicted phones, labels
    with torch.inference_mode():
        for item in items:
            clip, _ = load_mono(Path(args.targets) / f"{item.item_id}.wav", 16000)
            prompt, _ = load_mono(Path(args.prompts) / f"{item.item_id}.wav", 16000)
            x = torch.from_numpy(codec._encoder_inputs(clip, log_mel(clip, SEMANTIC_STACK)))[None]
            feats = codec.encoder.features(x, codec.cfg.get("token_layer", "bottleneck"))[0]
            tokens = _assign(feats, codec.centroids).numpy()
            predicted = codec.encoder(x)[0].argmax(-1).numpy()
            labels = _frame_labels(align[item.target_id], len(tokens), index, 16000 / (HOP * SEMANTIC_STACK))
            rows.append((item, prompt, tokens, predicted, labels))

    # the commonest token of each phone among frames the encoder gets right
    by_phone: dict[int, Counter] = defaultdict(Counter)
    for _, _, tokens, predicted, labels in rows:
        for t, p, y in zip(tokens, predicted, labels):
            if p == y:
                by_phone[int(y)][int(t)] += 1
    fallback = Counter(int(t) for _, _, tokens, _, _ in rows for t in tokens).most_common(1)[0][0]
    commonest = {y: c.most_common(1)[0][0] for y, c in by_phone.items()}

    accuracy: dict[str, list[float]] = defaultdict(list)
    out = Path(args.out)
    for item, prompt, tokens, predicted, labels in rows:
        repaired = np.array([t if p == y else commonest.get(int(y), fallback)
                             for t, p, y in zip(tokens, predicted, labels)])
        phone_only = np.array([commonest.get(int(y), fallback) for y in labels])
        for name, codes in (("tokens", tokens), ("phone_fixed", repaired), ("phone_only", phone_only)):
            audio = codec.decode([codes[None].astype(np.int64)], prompt_audio=[prompt])[0]
            (out / name).mkdir(parents=True, exist_ok=True)
            sf.write(str(out / name / f"{item.item_id}.wav"), audio, 16000, subtype="PCM_16")
        voice = voices.get(item.speaker, (item.speaker, ""))
        accuracy[f"{voice[0]} ({voice[1]})" if voice[1] else voice[0]].append(float((predicted == labels).mean()))
    report = {voice: round(float(np.mean(a)), 4) for voice, a in sorted(accuracy.items())}
    (out / "phone_accuracy.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"items": len(rows), "phone_accuracy_per_voice": report}, indent=1))


if __name__ == "__main__":
    main()
