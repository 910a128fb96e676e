"""LibriSpeech test-clean (Panayotov et al., 2015; OpenSLR 12): the papers' zero-shot test set.

Layout of the extracted archive::

    LibriSpeech/SPEAKERS.TXT  CHAPTERS.TXT  BOOKS.TXT  LICENSE.TXT  README.TXT
    LibriSpeech/test-clean/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac       16 kHz
    LibriSpeech/test-clean/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt        "<utt id> <TEXT>"

All 2,620 utterances of the 40 readers go to the test split (held-out speakers). The 4-10 s
subset and the two task lists (continuation: the first 3 s of the target as prompt;
cross-sentence: another utterance of the same reader as prompt) are drawn from that split by
:mod:`arnar.evaluate.testlists` with ``evaluation.min_duration``/``max_duration`` (4/10 s).
Transcripts are upper case; they are sentence-cased (:func:`.corpus.sentence_case`) to match
the cased LibriTTS training text. Audio is resampled to the corpus rate (24 kHz for libritts).
"""

from __future__ import annotations

from pathlib import Path

from arnar.corpus.manifests import CorpusError
from arnar.corpus.recipes.corpus import SourceItem, sentence_case
from arnar.corpus.recipes.download import Archive
from arnar.corpus.recipes.librivox import read_speaker_genders

SOURCE = "librispeech"
TEST_PART = "test-clean"
OPENSLR_RESOURCE = 12
# sha256 of each archive as published with torchaudio's LIBRISPEECH dataset
# (pytorch/audio, src/torchaudio/datasets/librispeech.py, _CHECKSUMS).
SHA256 = {
    "dev-clean": "76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3",
    "dev-other": "12661c48e8c3fe1de2c1caa4c3e135193bfb1811584f11f569dd12645aa84365",
    "test-clean": "39fde525e59672dc6d1551919b1478f724438a95aa55f874b576be21967e6c23",
    "test-other": "d09c181bba5cf717b3dee7d4d592af11a3ee3a09e08ae025c5506f6ebe961c29",
}
CHECKSUM_ORIGIN = "torchaudio.datasets.LIBRISPEECH _CHECKSUMS"


def archive(part: str, mirror: str) -> Archive:
    if part not in SHA256:
        raise CorpusError(f"LibriSpeech part {part!r} is not used here (parts: {', '.join(SHA256)})")
    return Archive(SOURCE, part, f"{mirror.rstrip('/')}/{OPENSLR_RESOURCE}/{part}.tar.gz",
                   f"sha256:{SHA256[part]}", CHECKSUM_ORIGIN)


def items(extracted: Path, part: str = TEST_PART, split: str = "test") -> list[SourceItem]:
    """The utterances of one extracted part (``extracted`` holds ``LibriSpeech/``)."""
    root = Path(extracted) / "LibriSpeech"
    part_dir = root / part
    if not part_dir.is_dir():
        raise CorpusError(f"{part_dir}: LibriSpeech {part} is not there; run `arnar corpus download "
                          f"--source librispeech --part {part}` first")
    genders = read_speaker_genders(root / "SPEAKERS.TXT")
    found = []
    for transcript in sorted(part_dir.glob("*/*/*.trans.txt")):
        speaker = transcript.parent.parent.name
        texts = {}
        for number, line in enumerate(transcript.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            utt_id, _, text = line.strip().partition(" ")
            if not utt_id.startswith(f"{speaker}-{transcript.parent.name}-"):
                raise CorpusError(f"{transcript}:{number}: utterance id {utt_id!r} is not of this chapter")
            texts[utt_id] = sentence_case(text) if text.strip() else None
        audio = {p.name[: -len(".flac")]: p for p in transcript.parent.glob("*.flac")}
        # every utterance named by either side: ingest quarantines the unpaired ones
        for utt_id in sorted(set(texts) | set(audio)):
            path = audio.get(utt_id, transcript.parent / f"{utt_id}.flac")
            found.append(SourceItem(utt_id, speaker, path, texts.get(utt_id), SOURCE, part,
                                    genders.get(speaker, ""), split))
    if not found:
        raise CorpusError(f"{part_dir}: no <speaker>/<chapter>/*.trans.txt found")
    return found
