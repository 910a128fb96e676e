"""The `arnar` command: thin entry points over the package, one subcommand per pipeline step.

Snakemake rules call these with explicit arguments (so a changed value reruns the rule);
people call them the same way. Every subcommand exits with a one-line error naming the file
and the problem for bad input, never with a traceback from deep inside.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import shutil
import sys
from pathlib import Path

from arnar.atomic import atomic_path  # every output is written through arnar.atomic
from arnar.atomic import write_text as _atomic_write_text

log = logging.getLogger("arnar")


def cmd_config(args: argparse.Namespace) -> None:
    from arnar.config import load_params

    overrides = {"profile": args.profile} if args.profile else None
    print(json.dumps(load_params(args.params, overrides), indent=2))


def cmd_config_docs(args: argparse.Namespace) -> None:
    from arnar.config_docs import render_config_docs

    text = render_config_docs(Path(args.params))
    if args.out:
        _atomic_write_text(Path(args.out), text)
        log.info("wrote %s", args.out)
    else:
        print(text, end="")


def cmd_runs(args: argparse.Namespace) -> None:
    from arnar.config import load_params
    from arnar.runs import run_registry

    overrides = {"profile": args.profile} if args.profile else None
    params = load_params(args.params, overrides)
    registry = run_registry(params)
    rows = []
    for run in registry.all_runs():
        spec = registry.runs[run]
        chain = ([f"init_from {spec['init_from']}" + (" (matching tensors)" if spec.get("init_matching") else "")]
                 if "init_from" in spec else []) + \
            [f"reads {r}" for r in spec.get("reads", [])] + \
            ([f"base {registry.run_base[run]}"] if run in registry.run_base else [])
        systems = [s for s, (r, _) in registry.paradigm_systems.items() if r == run]
        rows.append((run, spec["config"], ", ".join(chain) or "-", " ".join(systems) or "-"))
    print(f"profile {params['profile']}: {len(rows)} runs, {len(registry.paradigm_systems)} evaluated systems")
    header = ("run", "config", "chain", "systems")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])


def cmd_synth(args: argparse.Namespace) -> None:
    from arnar.corpus.synth import build_synth_corpus

    summary = build_synth_corpus(
        Path(args.out),
        n_speakers=args.speakers,
        utterances_per_speaker=args.utterances_per_speaker,
        n_test_speakers=args.test_speakers,
        seed=args.seed,
        sample_rate=args.sample_rate,
        workers=args.workers,
    )
    log.info("corpus: %s", json.dumps(summary, sort_keys=True))


def cmd_ingest(args: argparse.Namespace) -> None:
    from arnar.corpus.manifests import ingest_corpus
    from arnar.corpus.validate import ValidationLimits

    limits = ValidationLimits(
        sample_rate=args.sample_rate,
        min_duration=args.min_duration,
        max_duration=args.max_duration,
        silence_dbfs=args.silence_dbfs,
        clip_fraction=args.clip_fraction,
    )
    summary = ingest_corpus(
        Path(args.corpus), Path(args.out), limits=limits, dev_fraction=args.dev_fraction,
        seed=args.seed, workers=args.workers,
    )
    log.info(
        "ingest: %d accepted, %d quarantined (%s), %.3f h",
        summary["accepted"], summary["quarantined"]["total"],
        ", ".join(f"{k}: {v}" for k, v in summary["quarantined"]["by_reason"].items()) or "none",
        summary["hours"],
    )


def cmd_tokenizers(args: argparse.Namespace) -> None:
    from arnar.text.build import build_tokenizers

    report = build_tokenizers(
        supervisions=Path(args.supervisions), bpe_model=Path(args.bpe),
        phonemes=Path(args.phonemes), vocab_size=args.bpe_vocab_size, seed=args.seed,
    )
    _atomic_write_text(Path(args.report), json.dumps(report, indent=2, sort_keys=True) + "\n")


def cmd_corpus_report(args: argparse.Namespace) -> None:
    summary = json.loads(Path(args.summary).read_text(encoding="utf-8"))
    corpus_summary = Path(args.corpus) / "summary.json"
    if corpus_summary.exists():
        summary["synthesis"] = json.loads(corpus_summary.read_text(encoding="utf-8"))
    _atomic_write_text(Path(args.out), json.dumps(summary, indent=2, sort_keys=True) + "\n")
    with atomic_path(args.quarantine_out) as tmp:
        shutil.copyfile(args.quarantine, tmp)


def _mirrors(args: argparse.Namespace) -> dict:
    return {key: url for key, url in (("openslr", args.mirror_openslr), ("mls", args.mirror_mls)) if url}


def cmd_corpus_download(args: argparse.Namespace) -> None:
    from arnar.corpus.recipes import download_part

    extracted = download_part(args.source, args.part, Path(args.download_dir), mirrors=_mirrors(args),
                              mls_audio=args.mls_audio, retries=args.retries,
                              keep_archive=not args.remove_archive)
    log.info("%s %s: verified and extracted in %s", args.source, args.part, extracted)


def cmd_corpus_prepare(args: argparse.Namespace) -> None:
    from arnar.corpus.manifests import CorpusError
    from arnar.corpus.recipes import prepare_corpus

    if args.corpus == "folder":  # your own recordings (arnar.corpus.recipes.folder)
        from arnar.corpus.recipes.folder import prepare_folder_corpus

        if not args.path:
            raise CorpusError("--corpus folder needs --path, the folder of your recordings")
        summary = prepare_folder_corpus(Path(args.path), Path(args.out), sample_rate=args.sample_rate,
                                        test_speakers=args.test_speakers, seed=args.seed, workers=args.workers)
        log.info("corpus folder %s: %d audio files, %d speakers, %.2f h", args.path, summary["audio_files"],
                 summary["speakers"], summary["hours"])
        return
    if not args.download_dir:
        raise CorpusError(f"--corpus {args.corpus} needs --download-dir")
    mls_options = {"audio": args.mls_audio, "min_snr": args.mls_min_snr, "min_c50": args.mls_min_c50,
                   "estimator": args.mls_estimator, "brouhaha_model": args.mls_brouhaha_model}
    summary = prepare_corpus(args.corpus, Path(args.download_dir), Path(args.out), sample_rate=args.sample_rate,
                             libritts_parts=args.libritts_parts, mls_options=mls_options, workers=args.workers)
    log.info("corpus %s: %d utterances, %d speakers, %.2f h", args.corpus, summary["utterances"],
             summary["speakers"], summary["hours"])


def _items_per_task(text: str) -> int | dict[str, int]:
    """``--max-items``: ``60`` (both tasks) or ``continuation=30,cross_sentence=60``."""
    try:
        if "=" not in text:
            return int(text)
        return {task.strip(): int(n) for task, n in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a count (60) or task=count pairs "
                                         "(continuation=30,cross_sentence=60)") from None


def cmd_testlists(args: argparse.Namespace) -> None:
    from arnar.evaluate.testlists import TASKS, build_testlists, frozen_path, to_tsv, verify_testlist

    lists = build_testlists(
        Path(args.cuts), min_duration=args.min_duration, max_duration=args.max_duration,
        prompt_seconds=args.prompt_seconds, max_items=args.max_items, seed=args.seed, per_voice=args.per_voice,
    )
    for task in TASKS:
        frozen = Path(args.frozen_dir) / f"{task}.tsv" if args.frozen_dir else frozen_path(args.profile, task)
        if args.write:
            _atomic_write_text(frozen, to_tsv(lists[task]))
            log.info("froze %d %s items in %s", len(lists[task]), task, frozen)
            continue
        verify_testlist(frozen, lists[task])
        _atomic_write_text(Path(args.out_dir) / f"{task}.tsv", to_tsv(lists[task]))
        log.info("%s: %d items, matches the frozen list %s", task, len(lists[task]), frozen)


def cmd_task_audio(args: argparse.Namespace) -> None:
    from arnar.evaluate.run import prepare_task_audio
    from arnar.evaluate.testlists import read_testlist

    items = read_testlist(Path(args.testlist))
    prepare_task_audio(items, Path(args.recordings), Path(args.targets), Path(args.prompts))
    log.info("wrote %d targets and prompts", len(items))


def _backends(args: argparse.Namespace):
    from arnar.evaluate.asr import load_asr
    from arnar.evaluate.similarity import load_speaker_encoder

    asr = {name: load_asr(name) for name in args.asr}
    return asr, load_speaker_encoder(args.sim)


def _mos_predictor(args: argparse.Namespace):
    """The ``--mos`` predictor, or None (``none``, or one that cannot run here: a warning says why
    and the evaluation goes on without the column)."""
    if args.mos == "none":
        return None
    from arnar.evaluate.mos import MosUnavailableError, load_mos_predictor

    try:
        return load_mos_predictor(args.mos, dnsmos_windows=args.mos_windows)
    except MosUnavailableError as err:
        log.warning("MOS not reported: %s", err)
        return None


def cmd_evaluate(args: argparse.Namespace) -> None:
    from arnar.evaluate.run import evaluate_system, read_voice_groups
    from arnar.evaluate.testlists import read_testlist

    asr, encoder = _backends(args)
    mos = _mos_predictor(args)
    voices = read_voice_groups(Path(args.corpus)) if args.corpus else None
    result = evaluate_system(
        system=args.system, task=args.task, system_dir=Path(args.system_dir),
        items=read_testlist(Path(args.testlist)), prompts_dir=Path(args.prompts),
        asr_backends=asr, speaker_encoder=encoder, out_json=Path(args.out_json),
        out_tsv=Path(args.out_tsv), d_llm=args.d_llm, mos_predictor=mos, voices=voices,
    )
    log.info("%s/%s: %s", args.system, args.task, json.dumps(
        {k: round(v["wer_corpus"], 2) for k, v in result["asr"].items()} | {"sim": result["sim"]["mean"]}))


def cmd_audit(args: argparse.Namespace) -> None:
    from arnar.evaluate.run import ground_truth_audit, read_voices

    asr, encoder = _backends(args)
    result = ground_truth_audit(
        cuts_paths=[Path(p) for p in args.cuts], voices=read_voices(Path(args.corpus)),
        asr_backends=asr, speaker_encoder=encoder, out_json=Path(args.out_json), out_tsv=Path(args.out_tsv),
        per_speaker=args.per_speaker, mos_predictor=_mos_predictor(args),
    )
    log.info("audit: %d utterances, %s", result["utterances"],
             {k: round(v["overall"]["wer_corpus"], 2) for k, v in result["asr"].items()})


def cmd_report(args: argparse.Namespace) -> None:
    from arnar.report import build_report

    build_report(
        eval_dir=Path(args.eval_dir), testlist_dir=Path(args.testlists), prompts_dir=Path(args.prompts),
        systems_dir=Path(args.systems_dir), systems=args.systems, out_dir=Path(args.out_dir),
        samples=args.samples, profile=args.profile, train_dir=Path(args.train_dir) if args.train_dir else None,
        layout=json.loads(args.layout) if args.layout else None,
    )


def cmd_samples(args: argparse.Namespace) -> None:
    from arnar.samples import build_samples

    summary = build_samples(testlist=Path(args.testlist), prompts_dir=Path(args.prompts),
                            systems_dir=Path(args.systems_dir), systems=args.systems, out_dir=Path(args.out),
                            profile=args.profile, task=args.task, count=args.items)
    log.info("samples: %d items x %d rows, %d files, %.2f MB in %s", len(summary["items"]), len(summary["rows"]),
             summary["files"], summary["bytes"] / 1e6, args.out)


def cmd_align(args: argparse.Namespace) -> None:
    from arnar.align import AlignmentFailure, alignment_to_json, items_from_cuts, load_aligner

    aligner = load_aligner(args.aligner, **({"workers": args.workers} if args.aligner in ("mfa", "pocketsphinx") else {}))
    items = items_from_cuts(Path(args.cuts), per_speaker=args.per_speaker)
    results = aligner.align_batch(items)
    good = [r for r in results if not isinstance(r, AlignmentFailure)]
    failed = sorted((r.utt_id, r.reason) for r in results if isinstance(r, AlignmentFailure))
    _atomic_write_text(Path(args.out), "".join(json.dumps(alignment_to_json(a), sort_keys=True) + "\n" for a in good))
    _atomic_write_text(Path(args.quarantine),
                       "utt_id\treason\n" + "".join(f"{u}\t{r}\n" for u, r in failed))
    log.info("%s: aligned %d of %d utterances, %d quarantined", aligner.model_id, len(good), len(items), len(failed))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def cmd_align_accuracy(args: argparse.Namespace) -> None:
    from arnar.align import alignment_from_json
    from arnar.align.accuracy import accuracy_markdown, score_aligner
    from arnar.evaluate.run import read_voices

    from lhotse import load_manifest

    voices = read_voices(Path(args.corpus))
    oracle = {d["utt_id"]: alignment_from_json(d) for p in args.oracle for d in _read_jsonl(p)}
    speaker_of = {c.id: c.supervisions[0].speaker for p in args.cuts for c in load_manifest(p)}

    def group(utt: str) -> str:  # per voice where the corpus names voices, else per speaker
        speaker = speaker_of.get(utt, "unknown")
        return voices.get(speaker, speaker)

    pairs = [(group(d["utt_id"]), alignment_from_json(d), oracle[d["utt_id"]])
             for p in args.aligned for d in _read_jsonl(p) if d["utt_id"] in oracle]
    failures: dict[str, int] = {}
    for path in args.quarantine:
        for line in Path(path).read_text(encoding="utf-8").splitlines()[1:]:
            utt = line.split("\t", 1)[0]
            failures[group(utt)] = failures.get(group(utt), 0) + 1
    result = score_aligner(pairs, failures)
    _atomic_write_text(Path(args.out_json), json.dumps({"aligner": args.aligner, "groups": result}, indent=2) + "\n")
    _atomic_write_text(Path(args.out_md), accuracy_markdown(args.aligner, result))
    overall = result["overall"]
    log.info("%s vs oracle: word boundaries median %s ms, within 20 ms %s; %d failed",
             args.aligner, overall["word"]["median_ms"], overall["word"]["within_20ms"], overall["failed"])


def cmd_durations(args: argparse.Namespace) -> None:
    from lhotse import load_manifest

    from arnar.align import alignment_from_json
    from arnar.align.durations import DurationError, bpe_durations
    from arnar.text import load_text_tokenizer

    tokenizer = load_text_tokenizer(args.text_units)
    texts = {c.id: c.supervisions[0].text for c in load_manifest(args.cuts)}
    rows, failed = [], []
    for record in _read_jsonl(Path(args.alignments)):
        alignment = alignment_from_json(record)
        try:
            result = bpe_durations(texts[alignment.utt_id], alignment.words, alignment.duration, tokenizer,
                                   frame_rate=args.frame_rate)
        except DurationError as err:
            failed.append((alignment.utt_id, f"durations: {err}"))
            continue
        rows.append({"utt_id": alignment.utt_id, "frame_rate": args.frame_rate, "num_frames": result.num_frames,
                     "bpe_ids": result.ids, "ends": result.ends})
    _atomic_write_text(Path(args.out), "".join(json.dumps(r) + "\n" for r in rows))
    _atomic_write_text(Path(args.quarantine), "utt_id\treason\n" + "".join(f"{u}\t{r}\n" for u, r in failed))
    log.info("durations at %s Hz: %d utterances, %d quarantined", args.frame_rate, len(rows), len(failed))


def cmd_train_codec(args: argparse.Namespace) -> None:
    from arnar.codec.offline import train_offline_codec

    sizes = json.loads(args.sizes) if args.sizes else {}
    report = train_offline_codec(Path(args.cuts), Path(args.alignments) if args.alignments else None,
                                 Path(args.out), seed=args.seed, threads=args.threads,
                                 tokens_out=Path(args.tokens_out) if args.tokens_out else None,
                                 tokens_split=args.tokens_split, **sizes)
    log.info("offline codec trained: %s", json.dumps({k: v for k, v in report.items() if not isinstance(v, (list, dict))}))


def cmd_tokenize(args: argparse.Namespace) -> None:
    from lhotse import load_manifest

    from arnar.codec import encode_files, load_codec
    from arnar.codec.shards import write_token_shards

    codec = load_codec(args.codec, model=args.model)
    cuts = sorted(load_manifest(args.cuts), key=lambda c: c.id)
    paths = [Path(c.recording.sources[0].source) for c in cuts]
    tokens = {cut.id: codes for cut, (_, codes) in zip(cuts, encode_files(codec, paths))}
    write_token_shards(Path(args.out), args.split, tokens, codec)
    log.info("%s: %d utterances tokenized with %s", args.split, len(tokens), args.codec)


def cmd_resynthesize(args: argparse.Namespace) -> None:
    """Ground truth -> tokens -> audio for every test-list item: the codec's reference row."""
    import soundfile as sf

    from arnar.codec import load_codec
    from arnar.evaluate.audio import load_mono
    from arnar.evaluate.testlists import read_testlist

    options = {"n_codebooks": args.n_codebooks} if args.n_codebooks else {}
    if args.vocoder:
        options["vocoder"] = args.vocoder
    codec = load_codec(args.codec, model=args.model, **options)
    # a decoder that takes the voice from prompt audio (the offline codec) gets the item's prompt
    takes_prompt_audio = "prompt_audio" in inspect.signature(codec.decode).parameters
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = read_testlist(Path(args.testlist))
    for item in items:
        target, _ = load_mono(Path(args.targets) / f"{item.item_id}.wav", codec.sample_rate)
        prompt, _ = load_mono(Path(args.prompts) / f"{item.item_id}.wav", codec.sample_rate)
        codes = codec.encode([target], codec.sample_rate)[0]
        audio = codec.decode([codes], **({"prompt_audio": [prompt]} if takes_prompt_audio else {}))[0]
        with atomic_path(out / f"{item.item_id}.wav") as tmp:
            sf.write(str(tmp), audio, codec.sample_rate, subtype="PCM_16", format="WAV")
    log.info("resynthesized %d items with %s%s", len(items), args.codec, f" ({args.vocoder})" if args.vocoder else "")


def cmd_ladder(args: argparse.Namespace) -> None:
    """The teacher-forced rung of the diagnostic ladder (arnar.evaluate.ladder): a next-token run
    (or PALLE's stage one, span by span) fed the true prompt and target tokens; its argmax
    predictions decoded to audio. With --forced-levels, a Chain-of-Details run's level-forced rung
    instead (levels 1..N the truth's, the rest generated)."""
    from arnar.evaluate.ladder import level_forced_testlist, teacher_forced_testlist
    from arnar.synthesize import Synthesizer

    synth = Synthesizer(args.run_dir, codec=args.codec, codec_model=args.codec_model, bpe_model=args.text_units,
                        device=args.device, checkpoint=args.checkpoint)
    try:
        if args.forced_levels is not None:
            level_forced_testlist(synth, args.testlist, args.prompts, args.targets, args.out,
                                  forced_levels=args.forced_levels, seed=args.seed)
        else:
            teacher_forced_testlist(synth, args.testlist, args.prompts, args.targets, args.out)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None


def cmd_text_reliance(args: argparse.Namespace) -> None:
    """Dev loss of a run's checkpoints with each utterance's own text and with another's
    (arnar.evaluate.text_reliance): whether the model reads the text at all."""
    from arnar.evaluate.text_reliance import markdown, run_text_reliance

    rows = run_text_reliance(args.run_dir, args.checkpoints, dev_tokens=args.dev_tokens,
                             dev_durations=args.dev_durations, shift=args.shift, out=args.out)
    print(markdown(rows), end="")


def _decoding_options(text: str) -> dict:
    """``--decoding``: a JSON object of decoding options (refused in one line otherwise)."""
    from arnar.synthesize import SynthesisInputError

    try:
        decoding = json.loads(text)
    except json.JSONDecodeError as err:
        raise SynthesisInputError(f"--decoding: not JSON ({err})") from None
    if not isinstance(decoding, dict):
        raise SynthesisInputError(f"--decoding: expected a JSON object of options, got {text!r}")
    return decoding


def cmd_curve(args: argparse.Namespace) -> None:
    """A learning curve (arnar.evaluate.curve): each kept checkpoint of a run speaks a test list
    with one seed and is judged like any system; curve.md and curve.json under --out."""
    from arnar.evaluate.curve import kept_checkpoints, learning_curve
    from arnar.evaluate.run import evaluate_system, read_voice_groups
    from arnar.evaluate.testlists import read_testlist
    from arnar.synthesize import Synthesizer, synthesize_testlist

    decoding = _decoding_options(args.decoding)
    checkpoints = args.checkpoints or kept_checkpoints(args.run_dir)  # a run without any: refused before the judges load
    items = read_testlist(Path(args.testlist))
    asr, encoder = _backends(args)
    voices = read_voice_groups(Path(args.corpus)) if args.corpus else None
    summary = Path(args.run_dir) / "train_summary.json"
    facts = json.loads(summary.read_text()) if summary.is_file() else {}

    def speak(checkpoint: str, wav_dir: Path) -> None:
        synth = Synthesizer(args.run_dir, codec=args.codec, codec_model=args.codec_model, bpe_model=args.text_units,
                            decoding=dict(decoding), checkpoint=checkpoint)
        synthesize_testlist(synth, args.testlist, args.prompts, wav_dir, seed=args.seed,
                            prompt_alignments=args.prompt_alignments)

    def judge(checkpoint: str, wav_dir: Path, out_json: Path) -> dict:
        return evaluate_system(system=f"{Path(args.run_dir).name}@{checkpoint}", task=Path(args.testlist).stem,
                               system_dir=wav_dir, items=items, prompts_dir=Path(args.prompts), asr_backends=asr,
                               speaker_encoder=encoder, out_json=out_json, out_tsv=out_json.with_suffix(".tsv"),
                               d_llm=args.d_llm, voices=voices)

    rows = learning_curve(args.run_dir, checkpoints, speak=speak, judge=judge, out_dir=args.out,
                          final_dev_loss=facts.get("final_dev_loss"), best_dev_loss=facts.get("best_dev_loss"))
    print((Path(args.out) / "curve.md").read_text(), end="")
    log.info("learning curve of %s: %d checkpoints -> %s", args.run_dir, len(rows), args.out)


def cmd_synthesize(args: argparse.Namespace) -> None:
    """A trained paradigm speaks a frozen test list (or one sentence) through the codec."""
    import soundfile as sf

    from arnar.synthesize import SILENCE_DBFS, SynthesisInputError, Synthesizer, synthesize_testlist

    # bad flags are refused before the model loads; text and prompt limits: arnar.synthesize
    decoding = _decoding_options(args.decoding)
    # a synthesis option, not the paradigm's: speak each test item for its ground-truth duration
    target_duration = decoding.pop("target_duration", None)
    if target_duration not in (None, "ground_truth"):
        raise SynthesisInputError(f"--decoding: target_duration must be 'ground_truth', got {target_duration!r}")
    if target_duration and not args.testlist:
        raise SynthesisInputError("--decoding: target_duration 'ground_truth' needs --testlist (its items' durations)")
    if args.prompt_alignments and not args.testlist:
        raise SynthesisInputError("--prompt-alignments needs --testlist (its items name the prompts' recordings)")
    if args.testlist:
        if not (args.prompts and args.out):
            raise SynthesisInputError("--testlist needs --prompts and --out")
    else:
        # presence, not truth: an empty --text is given, and refused below as empty text by name
        missing = [flag for flag, value in (("--text", args.text), ("--prompt-wav", args.prompt_wav),
                                            ("--prompt-text", args.prompt_text), ("--out", args.out)) if value is None]
        if missing:
            raise SynthesisInputError(f"give either --testlist, or --text, --prompt-wav, --prompt-text and --out "
                                      f"(a .wav path); missing: {' '.join(missing)}")
        if not Path(args.out).parent.is_dir():
            raise SynthesisInputError(f"--out {args.out}: no such folder {Path(args.out).parent}")
    synth = Synthesizer(args.run_dir, codec=args.codec, codec_model=args.codec_model, bpe_model=args.text_units,
                        device=args.device, decoding=decoding, checkpoint=args.checkpoint, vocoder=args.vocoder,
                        silence_dbfs=SILENCE_DBFS if args.silence_dbfs is None else args.silence_dbfs)
    if args.testlist:
        synthesize_testlist(synth, args.testlist, args.prompts, args.out, seed=args.seed,
                            ground_truth_duration=bool(target_duration), prompt_alignments=args.prompt_alignments,
                            batch_size=args.batch_size, timing_items=args.timing_items)
        return
    synth.text_ids(args.text, "--text")  # the text's errors before the prompt is read
    synth.text_ids(args.prompt_text, "--prompt-text")
    prompt, rate = synth.read_prompt(args.prompt_wav)
    audio, record = synth.synthesize(args.text, prompt, args.prompt_text, rate, seed=args.seed)
    try:
        with atomic_path(args.out) as tmp:  # the format from the extension, which the temporary name keeps
            sf.write(str(tmp), audio, synth.codec.sample_rate, subtype="PCM_16")
    except (sf.SoundFileError, OSError, TypeError) as err:  # TypeError: no audio format for the extension
        raise SynthesisInputError(f"--out {args.out}: cannot write ({err})") from None
    log.info("wrote %s (%.2f s, %s)", args.out, len(audio) / synth.codec.sample_rate, json.dumps(record))


def build_parser() -> argparse.ArgumentParser:
    # `arnar --help` lists every subcommand with a one-line help (at most 54 characters, so each
    # fits its line in 80 columns; tests/test_cli.py checks); longer text goes in its description
    parser = argparse.ArgumentParser(prog="arnar", description=__doc__.splitlines()[0],
                                     epilog="'arnar <command> --help' gives a command's options.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_backends(p):
        from arnar.evaluate.asr import ASR_BACKENDS
        from arnar.evaluate.similarity import ENCODERS

        p.add_argument("--asr", action="append", required=True, choices=ASR_BACKENDS)
        p.add_argument("--sim", required=True, choices=ENCODERS)

    def add_vocoder(p):
        from arnar.codec.offline.vocoder import VOCODERS

        p.add_argument("--vocoder", choices=VOCODERS, help="the offline codec's mel -> audio (default: griffin_lim)")

    def add_mos(p):
        from arnar.evaluate.mos import MOS_PREDICTORS

        p.add_argument("--mos", default="none", choices=("none", *MOS_PREDICTORS),
                       help="naturalness predictor: dnsmos (offline, from its wheel) | utmosv2 (where installed)")
        p.add_argument("--mos-windows", default="first", choices=("first", "all"),
                       help="DNSMOS: score each clip's first 9.01 s window, or every window 1 s apart")

    p = sub.add_parser("config", help="validate params.yaml and print the resolved profile")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--profile", help="override the profile named in the file")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("config-docs", help="write docs/configuration.md from the schema",
                       description="Document every key of params.yaml (type, default, the profiles that "
                       "override it, meaning) from workflow/schemas/params.schema.yaml and params.yaml "
                       "(arnar.config_docs); tests/test_config_docs.py fails when the committed page is stale.")
    p.add_argument("--params", default="params.yaml", help="the params file (its schema: "
                   "workflow/schemas/params.schema.yaml beside it)")
    p.add_argument("--out", help="write the page here (default: print it)")
    p.set_defaults(func=cmd_config_docs)

    p = sub.add_parser("runs", help="list the profile's training runs and systems",
                       description="The profile's training runs, their chains (init_from, reads, base run) "
                       "and the systems evaluated from each (arnar.runs).")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--profile", help="override the profile named in the file")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("synth", help="build the embedded synthesized corpus")
    p.add_argument("--out", required=True)
    p.add_argument("--speakers", type=int, required=True)
    p.add_argument("--utterances-per-speaker", type=int, required=True)
    p.add_argument("--test-speakers", type=int, required=True)
    p.add_argument("--sample-rate", type=int, default=16000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("ingest", help="validate a corpus into manifests and a quarantine",
                       description="Validate a raw corpus folder and write lhotse manifests (train, dev, "
                       "test) and the quarantine report of the items that failed, with their reasons.")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sample-rate", type=int, required=True)
    p.add_argument("--min-duration", type=float, default=0.5)
    p.add_argument("--max-duration", type=float, default=30.0)
    p.add_argument("--silence-dbfs", type=float, default=-60.0)
    p.add_argument("--clip-fraction", type=float, default=0.01)
    p.add_argument("--dev-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("tokenizers", help="train BPE and build the phoneme tokenizer")
    p.add_argument("--supervisions", required=True, help="lhotse supervisions (train split)")
    p.add_argument("--bpe", required=True, help="output .model path (the .vocab lands beside it)")
    p.add_argument("--phonemes", required=True, help="output phoneme tokenizer JSON")
    p.add_argument("--report", required=True, help="output JSON report (vocab sizes, OOV rate)")
    p.add_argument("--bpe-vocab-size", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_tokenizers)

    p = sub.add_parser("corpus-report", help="publish corpus figures and the quarantine list")
    p.add_argument("--summary", required=True)
    p.add_argument("--quarantine", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quarantine-out", required=True)
    p.set_defaults(func=cmd_corpus_report)

    # Paper-scale corpora (arnar.corpus.recipes): `arnar corpus download`, then `arnar corpus prepare`.
    p = sub.add_parser("corpus", help="download and lay out a corpus for ingest",
                       description="Paper-scale corpora (libritts, mls): 'download' each part, then 'prepare' "
                       "lays the sources out as a corpus folder for ingest; 'prepare --corpus folder' lays out "
                       "your own recordings.")
    corpus_sub = p.add_subparsers(dest="corpus_command", required=True)

    def add_download_options(q, required=True):
        q.add_argument("--download-dir", required=required, help="archives and extracted sources")
        q.add_argument("--mls-audio", choices=["flac", "opus"], default="flac")

    q = corpus_sub.add_parser("download", help="download, verify and extract one part of a source")
    q.add_argument("--source", required=True, choices=["libritts", "librispeech", "mls"])
    q.add_argument("--part", required=True, help="e.g. train-clean-100, test-clean; english for mls")
    add_download_options(q)
    q.add_argument("--mirror-openslr", help="base URL replacing https://www.openslr.org/resources")
    q.add_argument("--mirror-mls", help="base URL replacing https://dl.fbaipublicfiles.com/mls")
    q.add_argument("--retries", type=int, default=3, help="automatic resumes after a dropped connection")
    q.add_argument("--remove-archive", action="store_true", help="delete the archive once extracted")
    q.set_defaults(func=cmd_corpus_download)

    q = corpus_sub.add_parser("prepare", help="lay out sources or your own folder for ingest",
                              description="Lay out the downloaded sources (libritts, mls), or your own folder "
                              "of recordings (folder), as a corpus folder for ingest.")
    q.add_argument("--corpus", required=True, choices=["libritts", "mls", "folder"])
    add_download_options(q, required=False)  # libritts, mls
    q.add_argument("--path", help="folder: the folder of your recordings (docs/own-corpus.md)")
    q.add_argument("--test-speakers", type=int, default=0, help="folder: speakers held out as the test split")
    q.add_argument("--seed", type=int, default=0, help="folder: the seed of the test speakers' choice")
    q.add_argument("--out", required=True)
    q.add_argument("--sample-rate", type=int, required=True)
    q.add_argument("--libritts-parts", nargs="*", default=["train-clean-100", "train-clean-360", "train-other-500"])
    q.add_argument("--mls-min-snr", type=float, default=55.0)
    q.add_argument("--mls-min-c50", type=float, default=55.0)
    q.add_argument("--mls-estimator", choices=["auto", "brouhaha", "offline"], default="auto")
    q.add_argument("--mls-brouhaha-model", default="ylacombe/brouhaha-best", help="hub id or path to best.ckpt")
    q.add_argument("--workers", type=int, default=1)
    q.set_defaults(func=cmd_corpus_prepare)

    p = sub.add_parser("align", help="forced-align one split (failures are quarantined)",
                       description="Forced-align one split; utterances the aligner cannot align are "
                       "quarantined with the reason.")
    p.add_argument("--aligner", required=True, choices=["pocketsphinx", "mfa", "oracle"])
    p.add_argument("--cuts", required=True)
    p.add_argument("--out", required=True, help="alignments, one JSON object per line")
    p.add_argument("--quarantine", required=True)
    p.add_argument("--workers", type=int, default=1,
                   help="MFA jobs, or pocketsphinx processes (same output for any number)")
    p.add_argument("--per-speaker", type=int, help="align only the first N cuts of each speaker (a fixed subset)")
    p.set_defaults(func=cmd_align)

    p = sub.add_parser("align-accuracy", help="score an aligner against the synthesizer's timings")
    p.add_argument("--aligner", required=True)
    p.add_argument("--aligned", action="append", required=True)
    p.add_argument("--quarantine", action="append", default=[])
    p.add_argument("--oracle", action="append", required=True)
    p.add_argument("--cuts", action="append", required=True, help="cuts of the scored splits (speakers)")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", required=True)
    p.set_defaults(func=cmd_align_accuracy)

    p = sub.add_parser("durations", help="BPE-level end positions a_n in codec frames")
    p.add_argument("--alignments", required=True)
    p.add_argument("--cuts", required=True, help="the same split's cuts (for the transcripts)")
    p.add_argument("--text-units", required=True)
    p.add_argument("--frame-rate", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quarantine", required=True)
    p.set_defaults(func=cmd_durations)

    p = sub.add_parser("train-codec", help="train the offline codec on a corpus",
                       description="Train the offline codec on a corpus's cuts and their phone alignments "
                       "(arnar.codec.offline).")
    p.add_argument("--cuts", required=True, help="training cuts")
    p.add_argument("--alignments", help="phone alignments JSONL of the same split")
    p.add_argument("--out", required=True, help="model folder")
    p.add_argument("--sizes", help="JSON object of recipe options (arnar.codec.offline.DEFAULTS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens-out", help="also write the semantic tokens of --cuts as the token set "
                   "<tokens-out>/<tokens-split>/ (what `arnar tokenize --codec offline` writes of them)")
    p.add_argument("--tokens-split", default="train", help="split name of --tokens-out (default train)")
    p.set_defaults(func=cmd_train_codec)

    p = sub.add_parser("tokenize", help="encode one split with a codec into token shards")
    p.add_argument("--codec", required=True)
    p.add_argument("--model", help="the codec's weights (file or folder)")
    p.add_argument("--cuts", required=True)
    p.add_argument("--split", required=True)
    p.add_argument("--out", required=True, help="token folder; shards go to <out>/<split>/")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("resynthesize", help="test-list targets through a codec and back",
                       description="Ground truth -> tokens -> audio for every test-list item: the codec's "
                       "reference row.")
    p.add_argument("--codec", required=True)
    p.add_argument("--model")
    p.add_argument("--n-codebooks", type=int, help="decode the first N quantizers only (offline_rvq: 1 is "
                   "Chain-of-Details' decoding path)")
    add_vocoder(p)
    p.add_argument("--testlist", required=True)
    p.add_argument("--targets", required=True, help="ground-truth system folder of the task")
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_resynthesize)

    p = sub.add_parser("ladder", help="teacher-forced rung of the diagnostic ladder",
                       description="The teacher-forced rung of the diagnostic ladder: a next-token run (or "
                       "PALLE stage one) fed the true tokens, its argmax predictions decoded (evaluate it like "
                       "any system).")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best")
    p.add_argument("--codec", required=True)
    p.add_argument("--codec-model")
    p.add_argument("--text-units", required=True, help="the text units the run read (bpe.model or phonemes.json)")
    p.add_argument("--testlist", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--targets", required=True, help="ground-truth system folder of the task")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--forced-levels", type=int, help="Chain-of-Details runs: the level-forced rung instead, levels "
                   "1..N from the ground truth and the rest generated")
    p.add_argument("--seed", type=int, default=1234, help="the level-forced rung's synthesis seed")
    p.set_defaults(func=cmd_ladder)

    p = sub.add_parser("text-reliance", help="dev loss with own and swapped texts",
                       description="Dev loss of a run with each utterance's own text and with another's: "
                       "whether the model reads its text (arnar.evaluate.text_reliance).")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoints", nargs="+", default=["best"], help="best, final, last or step_<N> (default: best)")
    p.add_argument("--dev-tokens", required=True, help="token split folder the run was evaluated on (tokens/<codec>/dev)")
    p.add_argument("--dev-durations", required=True, help="its durations JSONL (align/durations_<rate>hz/dev.jsonl)")
    p.add_argument("--shift", type=int, help="utterance i reads the text of i + shift (default: half the list)")
    p.add_argument("--out", help="write the rows as JSON here")
    p.set_defaults(func=cmd_text_reliance)

    p = sub.add_parser("synthesize", help="speak text or a test list with a trained paradigm",
                       description="Speak one sentence (--text) or a whole frozen test list (--testlist) with "
                       "a trained paradigm, through the codec it was trained on.")
    p.add_argument("--run-dir", required=True, help="a training run (data/<profile>/runs/<paradigm>)")
    p.add_argument("--checkpoint", default="best", help="best (lowest dev loss; the default), final, last, or step_<N>")
    p.add_argument("--codec", required=True, help="the token set the run was trained on (offline, s3)")
    p.add_argument("--codec-model", help="folder of a trained codec (the offline codec)")
    add_vocoder(p)
    p.add_argument("--text-units", required=True, help="the text units the run read (bpe.model or phonemes.json)")
    p.add_argument("--testlist", help="a frozen test list (TSV); with --prompts and --out (a folder)")
    p.add_argument("--prompts", help="folder of <item_id>.wav prompts")
    p.add_argument("--prompt-alignments", help="with --testlist: the aligner's JSONL of the prompts' split "
                   "(data/<profile>/align/<aligner>/test.jsonl); SyncSpeech's prompt a_n come from it, else uniform")
    p.add_argument("--batch-size", type=int, default=1,
                   help="with --testlist: decode this many items per forward pass (the paradigm's generate_batch; "
                   "one at a time where it has none); the same codes and audio; only --timing-items of them are decoded alone and timed (default 1: all)")
    p.add_argument("--timing-items", type=int, default=0,
                   help="with --batch-size > 1: decode this many items (spread over the list) alone, for "
                   "timing.jsonl's batch-1 speed figures (default 0: none)")
    p.add_argument("--text", help="one sentence to speak (instead of --testlist)")
    p.add_argument("--prompt-wav", help="prompt recording for --text")
    p.add_argument("--prompt-text", help="transcript of --prompt-wav")
    p.add_argument("--out", help="output folder (test list) or .wav (one sentence)")
    p.add_argument("--decoding", default="{}", help="JSON decoding options, e.g. '{\"steps\": 25}'")
    p.add_argument("--silence-dbfs", type=float, help="refuse a prompt whose RMS level is below this "
                   "(default: the ingest's, params.yaml validation.silence_dbfs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_synthesize)

    # `arnar train ...` is dispatched to arnar.train.main before this parser (see main); listed for --help
    # (their own parsers give the details: arnar stream --help, arnar train --help, ...)
    sub.add_parser("stream", help="SyncSpeech: audio chunks as the text arrives")
    sub.add_parser("cod-features", help="Chain-of-Details inputs: phonemes, speaker vectors")
    sub.add_parser("coarse-tokens", help="Chain-of-Details Table V: coarse token kinds")
    sub.add_parser("train", help="train one paradigm run (Hydra overrides after --)")

    p = sub.add_parser("testlists", help="build the test lists, check them against frozen ones",
                       description="Build the zero-shot test lists from the test split and check them against "
                       "the frozen ones (--write freezes them).")
    p.add_argument("--cuts", required=True, help="lhotse cuts of the test split")
    p.add_argument("--profile", default="mini", help="whose frozen lists (src/arnar/evaluate/testlists/<profile>)")
    p.add_argument("--frozen-dir", help="folder of the frozen lists (default: the profile's, in the package)")
    p.add_argument("--out-dir", help="where the verified lists are written")
    p.add_argument("--write", action="store_true", help="(re)freeze: write the lists into the frozen folder")
    p.add_argument("--min-duration", type=float, default=4.0)
    p.add_argument("--max-duration", type=float, default=10.0)
    p.add_argument("--prompt-seconds", type=float, default=3.0)
    p.add_argument("--max-items", type=_items_per_task, default=200,
                   help="items per task: one count for both (200) or one each (continuation=30,cross_sentence=60)")
    p.add_argument("--per-voice", choices=["random", "balanced"], default="random",
                   help="the seeded choice: over the whole split, or the same number from every test voice")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_testlists)

    p = sub.add_parser("task-audio", help="write a task's ground-truth targets and prompts")
    p.add_argument("--testlist", required=True)
    p.add_argument("--recordings", required=True)
    p.add_argument("--targets", required=True)
    p.add_argument("--prompts", required=True)
    p.set_defaults(func=cmd_task_audio)

    p = sub.add_parser("curve", help="learning curve: WER and SIM of each kept checkpoint",
                       description="A learning curve: each kept checkpoint of a run speaks a test list and is "
                       "judged (WER, SIM) beside its dev loss; curve.md and curve.json under --out.")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoints", nargs="+", help="names (step_<N>, best, final); default: every kept "
                   "checkpoints/step_<N>.pt, then final")
    p.add_argument("--codec", required=True)
    p.add_argument("--codec-model")
    p.add_argument("--text-units", required=True, help="the text units the run read (bpe.model or phonemes.json)")
    p.add_argument("--testlist", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--prompt-alignments")
    p.add_argument("--decoding", default="{}", help="JSON decoding options (the profile's for this system)")
    p.add_argument("--seed", type=int, default=0)
    add_backends(p)
    p.add_argument("--corpus", help="corpus folder: its speakers.tsv adds per-voice figures to each eval.json")
    p.add_argument("--d-llm", type=float, default=0.025)
    p.add_argument("--out", required=True, help="folder: <checkpoint>/wavs, <checkpoint>/eval.json, curve.md, curve.json")
    p.set_defaults(func=cmd_curve)

    p = sub.add_parser("evaluate", help="evaluate one system's audio on one task")
    p.add_argument("--system", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--system-dir", required=True, help="folder of <item_id>.wav (+ optional timing.jsonl)")
    p.add_argument("--testlist", required=True)
    p.add_argument("--prompts", required=True)
    add_backends(p)
    p.add_argument("--corpus", help="corpus folder: its speakers.tsv adds WER/SIM per voice and voice group")
    add_mos(p)
    p.add_argument("--d-llm", type=float, default=0.025)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-tsv", required=True)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("audit", help="ground-truth audit: per-voice WER, speaker SIM",
                       description="Ground-truth audit: WER per voice and same/different-speaker SIM of the "
                       "corpus's own recordings.")
    p.add_argument("--cuts", action="append", required=True)
    p.add_argument("--corpus", required=True, help="corpus folder (its speakers.tsv gives voices)")
    p.add_argument("--per-speaker", type=int, default=None,
                   help="audit only the first N utterances (by id) of each speaker (default: all)")
    add_backends(p)
    add_mos(p)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-tsv", required=True)
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("report", help="tables, plots and the HTML page with audio")
    p.add_argument("--eval-dir", required=True)
    p.add_argument("--testlists", required=True)
    p.add_argument("--prompts", required=True, help="folder with <task>/<item_id>.wav prompts")
    p.add_argument("--systems-dir", required=True, help="folder with <system>/<task>/<item_id>.wav")
    p.add_argument("--systems", nargs="+", required=True)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--profile", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--train-dir", help="folder of training summaries <system>.json (training table)")
    p.add_argument("--layout", help="JSON: reference rows, comparison systems with their seed replicas, grids, "
                                    "system -> run, system -> tasks (workflow/rules/runs.smk report_layout)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("samples", help="a few test items as MP3, with pages that play them",
                       description="A few test items (one speaker each where the list has them): the prompt, "
                       "every system's wav as MP3, README.md and index.html that play them (arnar.samples); "
                       "over 2 MB in all is an error.")
    p.add_argument("--testlist", required=True)
    p.add_argument("--prompts", required=True, help="folder of the task's <item_id>.wav prompts")
    p.add_argument("--systems-dir", required=True, help="folder with <system>/<task>/<item_id>.wav")
    p.add_argument("--systems", nargs="+", required=True, help="rows after the prompt, in page order")
    p.add_argument("--task", default="cross_sentence")
    p.add_argument("--items", type=int, default=3)
    p.add_argument("--profile", required=True)
    p.add_argument("--out", required=True, help="folder: <item_id>/<row>.mp3, README.md, index.html")
    p.set_defaults(func=cmd_samples)
    return parser


# Errors that mean "bad input or environment", reported as one line; anything else is a bug
# and keeps its traceback.
def _user_errors() -> tuple[type[BaseException], ...]:
    from arnar.config import ConfigError
    from arnar.corpus.manifests import CorpusError
    from arnar.corpus.synth import SynthError
    from arnar.corpus.texts import SourceMissingError
    from arnar.evaluate.audio import AudioError
    from arnar.evaluate.testlists import TestListError
    from arnar.text import TokenizerError

    from arnar.align import AlignerUnavailableError
    from arnar.codec import CodecError
    from arnar.evaluate.asr import AsrUnavailableError
    from arnar.evaluate.similarity import SimUnavailableError
    from arnar.synthesize import SynthesisInputError
    from arnar.evaluate.curve import CurveError
    from arnar.samples import SamplesError
    from arnar.train import TrainError

    # AsrUnavailableError / SimUnavailableError: hub weights that cannot be had, said in one line;
    # TrainError: a run or checkpoint that cannot be loaded (arnar synthesize --run-dir)
    return (ConfigError, CorpusError, SynthError, SourceMissingError, TokenizerError, TestListError,
            AudioError, AsrUnavailableError, SimUnavailableError, AlignerUnavailableError, CodecError, FileNotFoundError,
            SynthesisInputError, TrainError, CurveError, SamplesError)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:  # the engine parses its own arguments (paths, then Hydra overrides)
        from arnar.train import main as train_main

        return train_main(argv[1:])
    if argv[:1] == ["stream"]:  # SyncSpeech streaming synthesis (arnar.stream)
        from arnar.stream import main as stream_main

        return stream_main(argv[1:])
    if argv[:1] == ["cod-features"]:  # Chain-of-Details inputs (arnar.train.features)
        from arnar.train.features import main as cod_features_main

        return cod_features_main(argv[1:])
    if argv[:1] == ["coarse-tokens"]:  # CoD coarse token kinds (arnar.codec.coarse)
        from arnar.codec.coarse import main as coarse_tokens_main

        return coarse_tokens_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        args.func(args)
    except _user_errors() as err:
        print(f"arnar {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
