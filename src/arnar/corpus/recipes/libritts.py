"""LibriTTS (Zen et al., 2019; OpenSLR 60): the training corpus of the papers (585 h, 2,456 readers).

Layout of an extracted part (each part's archive also carries the top-level tables)::

    LibriTTS/SPEAKERS.txt  BOOKS.txt  CHAPTERS.txt  ...
    LibriTTS/<part>/<speaker>/<chapter>/<speaker>_<chapter>_<para>_<sent>.wav           24 kHz
    LibriTTS/<part>/<speaker>/<chapter>/<speaker>_<chapter>_<para>_<sent>.normalized.txt
    LibriTTS/<part>/<speaker>/<chapter>/<speaker>_<chapter>_<para>_<sent>.original.txt
    LibriTTS/<part>/<speaker>/<chapter>/<speaker>_<chapter>.trans.tsv

The transcript is the ``.normalized.txt`` (numbers and abbreviations spelled out, case and
punctuation kept), the text TTS systems trained on LibriTTS use. An utterance without it keeps
its audio and gets no transcript, so ingest quarantines it with its reason. Every training
part's readers go to the training split (ingest draws dev from them); LibriTTS's own dev and
test parts are not used: the test set is LibriSpeech test-clean (:mod:`.librispeech`), whose
readers are LibriTTS's test readers.
"""

from __future__ import annotations

from pathlib import Path

from arnar.corpus.manifests import CorpusError
from arnar.corpus.recipes.corpus import SourceItem
from arnar.corpus.recipes.download import Archive
from arnar.corpus.recipes.librivox import read_speaker_genders

SOURCE = "libritts"
TRAIN_PARTS = ("train-clean-100", "train-clean-360", "train-other-500")
OPENSLR_RESOURCE = 60
# sha256 of each archive as published with torchaudio's LIBRITTS dataset
# (pytorch/audio, src/torchaudio/datasets/libritts.py, _CHECKSUMS).
SHA256 = {
    "dev-clean": "da0864e1bd26debed35da8a869dd5c04dfc27682921936de7cff9c8a254dbe1a",
    "dev-other": "d413eda26f3a152ac7c9cf3658ef85504dfb1b625296e5fa83727f5186cca79c",
    "test-clean": "234ea5b25859102a87024a4b9b86641f5b5aaaf1197335c95090cde04fe9a4f5",
    "test-other": "33a5342094f3bba7ccc2e0500b9e72d558f72eb99328ac8debe1d9080402f10d",
    "train-clean-100": "c5608bf1ef74bb621935382b8399c5cdd51cd3ee47cec51f00f885a64c6c7f6b",
    "train-clean-360": "ce7cff44dcac46009d18379f37ef36551123a1dc4e5c8e4eb73ae57260de4886",
    "train-other-500": "e35f7e34deeb2e2bdfe4403d88c8fdd5fbf64865cae41f027a185a6965f0a5df",
}
CHECKSUM_ORIGIN = "torchaudio.datasets.LIBRITTS _CHECKSUMS"


def archive(part: str, mirror: str) -> Archive:
    if part not in SHA256:
        raise CorpusError(f"LibriTTS has no part {part!r} (parts: {', '.join(SHA256)})")
    return Archive(SOURCE, part, f"{mirror.rstrip('/')}/{OPENSLR_RESOURCE}/{part}.tar.gz",
                   f"sha256:{SHA256[part]}", CHECKSUM_ORIGIN)


def items(extracted: Path, part: str) -> list[SourceItem]:
    """The utterances of one extracted part (``extracted`` holds ``LibriTTS/``)."""
    root = Path(extracted) / "LibriTTS"
    part_dir = root / part
    if not part_dir.is_dir():
        raise CorpusError(f"{part_dir}: LibriTTS {part} is not there; run `arnar corpus download "
                          f"--source libritts --part {part}` first")
    genders = read_speaker_genders(root / "SPEAKERS.txt")
    found = []
    for wav in sorted(part_dir.glob("*/*/*.wav")):
        utt_id = wav.name[: -len(".wav")]
        speaker = wav.parent.parent.name
        if not utt_id.startswith(f"{speaker}_{wav.parent.name}_"):
            raise CorpusError(f"{wav}: name does not start with <speaker>_<chapter>_ of its folders")
        text_path = wav.with_name(f"{utt_id}.normalized.txt")
        text = " ".join(text_path.read_text(encoding="utf-8").split()) if text_path.is_file() else None
        found.append(SourceItem(utt_id, speaker, wav, text, SOURCE, part, genders.get(speaker, ""), "train"))
    if not found:
        raise CorpusError(f"{part_dir}: no <speaker>/<chapter>/*.wav found")
    return found
