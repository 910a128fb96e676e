"""Run the frozen protocol: prepare a task's audio, evaluate a system, audit the ground truth.

A *system* is a folder of generated audio, one ``<item_id>.wav`` per test-list item, plus an
optional ``timing.jsonl`` written by the generator (one JSON object per item with any of
``token_seconds``, ``total_seconds``, ``fpl_a`` (token stage until the first packet's tokens
exist), ``first_packet_decode_seconds`` (the codec's decoding of that packet),
``text_tokens_to_start`` (text tokens needed before decoding starts: Eq. 7's ``q + 1`` for
SyncSpeech, all of them for a model that reads the whole text), ``text_tokens_waited`` (text
tokens read when the first packet was complete), ``forward_passes``; the latency definitions are
in :mod:`arnar.evaluate.metrics`).
Any paradigm plugs in by writing that folder; the ground truth is a system too (the target
recordings themselves). An item without audio counts as an empty transcript (every word
deleted) and is listed under ``missing``: a system cannot improve its score by failing.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Sequence

import numpy as np
import soundfile as sf

from arnar.evaluate.audio import AudioError
from arnar.evaluate.metrics import (
    WordErrors,
    fpl_l,
    real_time_factor,
    summarize_wer,
    verification_separation,
    word_errors,
)
from arnar.evaluate.testlists import TestItem, TestListError

log = logging.getLogger(__name__)


def _atomic_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp.{path.name}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _atomic_tsv(path: Path, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp.{path.name}")
    with tmp.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(tmp, path)


def _write_wav(path: Path, audio: np.ndarray, rate: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp.{path.name}")
    sf.write(str(tmp), audio, rate, subtype="PCM_16", format="WAV")
    os.replace(tmp, path)


# --- task audio --------------------------------------------------------------------------------


def prepare_task_audio(items: Sequence[TestItem], recordings_path: Path, targets_dir: Path,
                       prompts_dir: Path) -> None:
    """Write each item's ground-truth target and its prompt (cut to prompt_start..prompt_end)."""
    from lhotse import load_manifest  # here, not at the top: evaluating a system needs no manifest

    recordings = {r.id: r for r in load_manifest(recordings_path)}
    for item in items:
        for needed in (item.target_id, item.prompt_id):
            if needed not in recordings:
                raise KeyError(f"{recordings_path}: no recording {needed!r} (test list item {item.item_id})")
        target = recordings[item.target_id]
        _write_wav(targets_dir / f"{item.item_id}.wav", target.load_audio()[0], target.sampling_rate)
        prompt = recordings[item.prompt_id]
        audio = prompt.load_audio(offset=item.prompt_start, duration=item.prompt_end - item.prompt_start)[0]
        _write_wav(prompts_dir / f"{item.item_id}.wav", audio, prompt.sampling_rate)


# --- one system on one task ----------------------------------------------------------------------


def _read_timing(system_dir: Path) -> dict[str, dict]:
    path = system_dir / "timing.jsonl"
    if not path.exists():
        return {}
    timing = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                record = json.loads(line)
                timing[record["item_id"]] = record
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{line_no}: not a timing record ({err})") from None
    return timing


def speed_summary(timing: dict[str, dict], durations: dict[str, float], d_llm: float) -> dict | None:
    """RTF (token stage, end to end), FPL-A, the first packet's codec decoding, FPL-L (Eq. 7 and
    its equivalent for models that read the whole text), FPL-L waited, forward passes: means over
    the items with timings (definitions: :mod:`arnar.evaluate.metrics`). FPL-L comes only from
    records that say ``text_tokens_to_start``: one without it (written before that field) has no
    Eq. 7 figure, and its ``fpl_a`` included the codec's decoding."""
    if not timing:
        return None
    summary: dict[str, float] = {"items_timed": len(timing)}
    audio = sum(durations[i] for i in timing)
    for key, name in (("token_seconds", "rtf_token_stage"), ("total_seconds", "rtf_end_to_end")):
        values = [t[key] for t in timing.values() if key in t]
        if len(values) == len(timing):
            summary[name] = real_time_factor(sum(values), audio)
    timed = [t for t in timing.values() if "fpl_a" in t]
    if timed:
        summary["fpl_a"] = float(np.mean([t["fpl_a"] for t in timed]))
        current = [t for t in timed if "text_tokens_to_start" in t]
        columns = {
            "first_packet_decode": [t["first_packet_decode_seconds"] for t in current
                                    if "first_packet_decode_seconds" in t],
            "fpl_l": [fpl_l(t["fpl_a"], t["text_tokens_to_start"], d_llm) for t in current],
            "fpl_l_waited": [fpl_l(t["fpl_a"], t["text_tokens_waited"], d_llm) for t in current
                             if "text_tokens_waited" in t],
        }
        summary.update({name: float(np.mean(values)) for name, values in columns.items() if values})
    passes = [t["forward_passes"] for t in timing.values() if "forward_passes" in t]
    if passes:
        summary["forward_passes"] = float(np.mean(passes))
    return summary


def evaluate_system(
    *,
    system: str,
    task: str,
    system_dir: Path,
    items: Sequence[TestItem],
    prompts_dir: Path,
    asr_backends: dict,
    speaker_encoder,
    out_json: Path,
    out_tsv: Path,
    d_llm: float,
    mos_predictor=None,
    voices: dict[str, tuple[str, str]] | None = None,
) -> dict:
    """Score one system on one task. ``voices`` (speaker -> (voice, voice group), from
    :func:`read_voice_groups`) adds WER and SIM per voice and per voice group."""
    from arnar.evaluate.asr import transcribe_files
    from arnar.evaluate.similarity import cosine, embed_files

    system_dir = Path(system_dir)
    present = [i for i in items if (system_dir / f"{i.item_id}.wav").exists()]
    missing = sorted(i.item_id for i in items if i not in present)
    if missing:
        log.warning("%s/%s: %d of %d items have no audio: %s", system, task, len(missing), len(items), missing[:5])
    paths = [system_dir / f"{i.item_id}.wav" for i in present]

    hypotheses = {}
    for name, backend in asr_backends.items():
        texts = dict(zip((i.item_id for i in present), transcribe_files(backend, paths)))
        hypotheses[name] = [texts.get(i.item_id, "") for i in items]
    errors = {name: [word_errors(i.target_text, h) for i, h in zip(items, hyps)]
              for name, hyps in hypotheses.items()}

    sims, sim_failed = {}, []
    prompts = embed_files(speaker_encoder, [prompts_dir / f"{i.item_id}.wav" for i in present])
    try:
        generated = embed_files(speaker_encoder, paths) if present else np.zeros((0, 1))
        sims = dict(zip((i.item_id for i in present), cosine(generated, prompts)))
    except AudioError:
        # some generated clip cannot be embedded (silent, too short): score the rest one by one
        for index, (item, path) in enumerate(zip(present, paths)):
            try:
                sims[item.item_id] = float(cosine(embed_files(speaker_encoder, [path]), prompts[index])[0])
            except AudioError as err:
                sim_failed.append(item.item_id)
                log.warning("%s/%s: no SIM for %s: %s", system, task, item.item_id, err)

    mos_scores = _mos_scores(mos_predictor, paths)
    mos = dict(zip((i.item_id for i in present), mos_scores[next(iter(mos_scores))])) if mos_scores else {}

    durations = {i.item_id: sf.info(str(system_dir / f"{i.item_id}.wav")).duration for i in present}
    groups = _item_groups(items, voices or {})
    asr_results = {}
    # per-item numbers for every judge, not only params.yaml's first: the report's headline judge is
    # the first key of the written JSON, whose keys are sorted
    for name, errs in errors.items():
        backend = asr_backends[name]
        asr_results[name] = dict(summarize_wer(errs), model=backend.model_id,
                                 model_sha256=getattr(backend, "model_sha256", {}),
                                 per_item=per_item_errors(items, errs))
        for kind, members in groups.items():
            asr_results[name][kind] = {g: summarize_wer([errs[i] for i in ix]) for g, ix in members.items()}
    result = {
        "system": system,
        "task": task,
        "items": len(items),
        "missing": missing,
        "asr": asr_results,
        "sim": {
            "backend": speaker_encoder.name,
            "model": speaker_encoder.model_id,
            "mean": float(np.mean(list(sims.values()))) if sims else None,
            "std": float(np.std(list(sims.values()))) if sims else None,
            "reference": "prompt audio (SIM-o: generated vs the original prompt)",
            "failed": sim_failed,
            **{kind: {g: _mean([sims.get(items[i].item_id) for i in ix]) for g, ix in members.items()}
               for kind, members in groups.items()},
        },
        "mos": {"backend": mos_predictor.name, "model": mos_predictor.model_id, "headline": next(iter(mos_scores)),
                "mean": float(np.mean(list(mos.values()))),
                **{column: float(np.mean(values)) for column, values in mos_scores.items()},
                **{kind: {g: _mean([mos.get(items[i].item_id) for i in ix]) for g, ix in members.items()}
                   for kind, members in groups.items()}} if mos else None,
        "speed": speed_summary(_read_timing(system_dir), durations, d_llm),
        "audio_seconds": round(sum(durations.values()), 3),
    }
    header = (["item_id", "speaker", "duration", "sim"] + (["mos"] if mos else [])
              + [c for n in asr_backends for c in (f"hyp_{n}", f"wer_{n}")])
    rows = []
    for index, item in enumerate(items):
        row = [item.item_id, item.speaker, round(durations.get(item.item_id, 0.0), 3),
               round(float(sims[item.item_id]), 4) if item.item_id in sims else ""]
        if mos:
            row.append(round(mos[item.item_id], 4) if item.item_id in mos else "")
        for name in asr_backends:
            row += [hypotheses[name][index], round(errors[name][index].wer, 4)]
        rows.append(row)
    _atomic_tsv(out_tsv, header, rows)
    _atomic_json(out_json, result)
    return result


def per_item_errors(items: Sequence[TestItem], errors: Sequence[WordErrors]) -> dict[str, list]:
    """Each item's errors (S + D + I) and reference words, in test-list order beside its id: what a
    paired bootstrap over items (:mod:`arnar.evaluate.bootstrap`) resamples. Lists rather than a
    mapping, so that the JSON keeps the test list's order (its keys are sorted when written)."""
    return {"item_ids": [i.item_id for i in items], "errors": [e.errors for e in errors],
            "ref_words": [e.ref_words for e in errors]}


def per_item_errors_from_utterances(tsv: Path, items: Sequence[TestItem], backend: str) -> dict[str, list]:
    """:func:`per_item_errors` recomputed from an evaluation's utterance TSV (its ``hyp_<backend>``
    column) and the test list's reference texts, with the same :func:`word_errors`: for evaluation
    JSONs written before they carried ``per_item``. An empty hypothesis (an item without audio)
    counts as every word deleted, as :func:`evaluate_system` counted it."""
    with Path(tsv).open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        column = f"hyp_{backend}"
        if column not in (reader.fieldnames or []):
            raise ValueError(f"{tsv}: no column {column!r} (columns: {', '.join(reader.fieldnames or [])})")
        hypotheses = {row["item_id"]: row[column] for row in reader}
    unknown = sorted(set(hypotheses) - {i.item_id for i in items})
    absent = [i.item_id for i in items if i.item_id not in hypotheses]
    if unknown or absent:
        raise TestListError(f"{tsv}: its items do not match the test list ({len(absent)} of the list's items absent, "
                         f"{len(unknown)} not in the list: {(absent + unknown)[:5]})")
    return per_item_errors(items, [word_errors(i.target_text, hypotheses[i.item_id]) for i in items])


def _item_groups(items: Sequence[TestItem], voices: dict[str, tuple[str, str]]) -> dict[str, dict[str, list[int]]]:
    """Item indices per voice and per voice group (empty when the corpus names no voices)."""
    if not voices:
        return {}
    by_voice, by_group = defaultdict(list), defaultdict(list)
    for index, item in enumerate(items):
        voice, group = voices.get(item.speaker, (item.speaker, "unknown"))
        by_voice[voice].append(index)
        by_group[group].append(index)
    return {"per_voice": dict(sorted(by_voice.items())), "per_voice_group": dict(sorted(by_group.items()))}


def _mos_scores(predictor, paths: Sequence[Path]) -> dict[str, list[float]]:
    """Each clip's naturalness scores, column -> list in ``paths`` order (the predictor's headline
    column first); empty without a predictor or clips. Audio is read at the predictor's rate."""
    if predictor is None or not paths:
        return {}
    from arnar.evaluate.audio import load_mono

    rate = predictor.sample_rate
    scores = predictor.score([load_mono(p, rate)[0] for p in paths], rate)
    return {column: [float(v) for v in values] for column, values in scores.items()}


def _mean(values) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


# --- ground-truth audit --------------------------------------------------------------------------

SEEN_VOICE = "seen voice"  # a test speaker whose base voice (pitch/tempo aside) a training speaker has
UNSEEN_VOICE = "unseen voice"  # a voice no training speaker uses


def read_voice_groups(corpus_dir: Path) -> dict[str, tuple[str, str]]:
    """speaker -> (voice, voice group) from speakers.tsv; empty for corpora without voices.

    A held-out speaker's voice group is ``seen voice`` when some training speaker is made from the
    same synthesizer voice (it is a pitch/tempo variant of a voice the models trained on) and
    ``unseen voice`` otherwise: the zero-shot case proper.
    """
    table = Path(corpus_dir) / "speakers.tsv"
    if not table.exists():
        return {}
    with table.open(encoding="utf-8", newline="") as handle:
        rows = [r for r in csv.DictReader(handle, delimiter="\t") if "voice" in r]
    trained = {r["voice"] for r in rows if r.get("split", "train") == "train"}
    return {r["speaker"]: (r["voice"], SEEN_VOICE if r["voice"] in trained else UNSEEN_VOICE) for r in rows}


def read_voices(corpus_dir: Path) -> dict[str, str]:
    """speaker -> voice from the corpus's speakers.tsv (synthesized corpora); empty otherwise."""
    table = Path(corpus_dir) / "speakers.tsv"
    if not table.exists():
        return {}
    with table.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return {r["speaker"]: r["voice"] for r in rows if "voice" in r}


def ground_truth_audit(
    *,
    cuts_paths: Sequence[Path],
    voices: dict[str, str],
    asr_backends: dict,
    speaker_encoder,
    out_json: Path,
    out_tsv: Path,
    per_speaker: int | None = None,
    mos_predictor=None,
) -> dict:
    """WER of the recordings themselves per voice / speaker / overall, and whether the speaker
    encoder separates same-speaker from different-speaker pairs. ``per_speaker``: audit only the
    first N utterances (by id) of each speaker, so that the audit's cost stays
    flat as the corpus grows (a 6 h corpus's test and dev splits hold 1490 utterances)."""
    from lhotse import load_manifest

    from arnar.evaluate.asr import transcribe_files
    from arnar.evaluate.similarity import embed_files

    if per_speaker is not None and per_speaker < 1:
        raise ValueError(f"per_speaker must be at least 1, got {per_speaker}")
    cuts = sorted((c for p in cuts_paths for c in load_manifest(p)), key=lambda c: c.id)
    if per_speaker is not None:
        taken: dict[str, int] = defaultdict(int)
        kept = []
        for cut in cuts:
            speaker = cut.supervisions[0].speaker
            if taken[speaker] < per_speaker:
                taken[speaker] += 1
                kept.append(cut)
        cuts = kept
    if not cuts:
        raise ValueError(f"no utterances in {', '.join(map(str, cuts_paths))}")
    paths = [Path(c.recording.sources[0].source) for c in cuts]
    speakers = [c.supervisions[0].speaker for c in cuts]
    texts = [c.supervisions[0].text for c in cuts]

    asr = {}
    rows = [[c.id, s, voices.get(s, ""), round(c.duration, 3)] for c, s in zip(cuts, speakers)]
    for name, backend in asr_backends.items():
        hyps = transcribe_files(backend, paths)
        errs = [word_errors(t, h) for t, h in zip(texts, hyps)]
        groups = {"overall": list(range(len(cuts)))}
        by_voice, by_speaker = defaultdict(list), defaultdict(list)
        for index, speaker in enumerate(speakers):
            by_speaker[speaker].append(index)
            if voices:
                by_voice[voices[speaker]].append(index)
        asr[name] = {
            "model": backend.model_id,
            "model_sha256": getattr(backend, "model_sha256", {}),
            "overall": summarize_wer(errs),
            "per_voice": {v: summarize_wer([errs[i] for i in ix]) for v, ix in sorted(by_voice.items())},
            "per_speaker": {s: summarize_wer([errs[i] for i in ix]) for s, ix in sorted(by_speaker.items())},
        }
        for row, hyp, err in zip(rows, hyps, errs):
            row += [hyp, round(err.wer, 4)]

    mos = None
    mos_scores = _mos_scores(mos_predictor, paths)
    if mos_scores:
        # the recordings' naturalness per voice: the ceiling every generated row is read against
        headline = next(iter(mos_scores))
        by_voice = defaultdict(list)
        for index, speaker in enumerate(speakers):
            by_voice[voices.get(speaker, speaker)].append(index)
        mos = {"backend": mos_predictor.name, "model": mos_predictor.model_id, "headline": headline,
               "overall": {c: float(np.mean(v)) for c, v in mos_scores.items()},
               "per_voice": {v: {c: float(np.mean([mos_scores[c][i] for i in ix])) for c in mos_scores}
                             for v, ix in sorted(by_voice.items())}}
        for row, value in zip(rows, mos_scores[headline]):
            row.append(round(value, 4))

    embeddings = embed_files(speaker_encoder, paths)
    scores = embeddings @ embeddings.T  # rows are L2-normalised: this is the cosine
    same, other_voice, same_voice_other_speaker = [], [], []
    for i, j in combinations(range(len(cuts)), 2):
        if speakers[i] == speakers[j]:
            same.append(scores[i, j])
        elif voices and voices[speakers[i]] == voices[speakers[j]]:
            same_voice_other_speaker.append(scores[i, j])
        else:
            other_voice.append(scores[i, j])
    different = other_voice + same_voice_other_speaker
    sim = {
        "backend": speaker_encoder.name,
        "model": speaker_encoder.model_id,
        "same_vs_different_speaker": verification_separation(same, different) if same and different else None,
    }
    edges = np.linspace(-1.0, 1.0, 101)
    groups = {"same speaker": same, "other voice" if voices else "other speaker": other_voice}
    if same_voice_other_speaker:
        groups["variant of the same voice"] = same_voice_other_speaker
    sim["histograms"] = {
        label: {"edges": [round(e, 3) for e in edges], "counts": np.histogram(values, edges)[0].tolist()}
        for label, values in groups.items() if values
    }
    if voices and other_voice and same_voice_other_speaker:
        # speakers made from one voice by pitch/tempo change: the hardest impostors
        sim["same_vs_variant_of_same_voice"] = verification_separation(same, same_voice_other_speaker)
        sim["same_vs_other_voice"] = verification_separation(same, other_voice)

    result = {
        "utterances": len(cuts),
        "per_speaker": per_speaker,
        "speakers": len(set(speakers)),
        "voices": sorted(set(voices[s] for s in speakers)) if voices else [],
        "asr": asr,
        "sim": sim,
        "mos": mos,
    }
    header = (["utt_id", "speaker", "voice", "duration"] + [c for n in asr_backends for c in (f"hyp_{n}", f"wer_{n}")]
              + (["mos"] if mos else []))
    _atomic_tsv(out_tsv, header, rows)
    _atomic_json(out_json, result)
    return result
