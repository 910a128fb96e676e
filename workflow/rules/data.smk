# Data phase: corpus -> validated lhotse manifests (+ quarantine report) -> text tokenizers.

from arnar.corpus.manifests import CorpusError

CORPUS = P["corpus"]
VALIDATION = P["validation"]

if CORPUS["name"] == "synth":

    rule synth_corpus:
        """Synthesize the embedded multi-speaker corpus from Debian's offline synthesizers."""
        output:
            corpus=directory(f"{DATA}/corpus"),
        params:
            speakers=CORPUS["speakers"],
            utterances=CORPUS["utterances_per_speaker"],
            test_speakers=CORPUS["test_speakers"],
            sample_rate=CORPUS["sample_rate"],
            seed=P["seed"],
        threads: P["workers"]
        log:
            f"{LOGS}/synth_corpus.log",
        conda:
            CORE_ENV
        shell:
            "arnar synth --out {output.corpus} --speakers {params.speakers}"
            " --utterances-per-speaker {params.utterances} --test-speakers {params.test_speakers}"
            " --sample-rate {params.sample_rate} --seed {params.seed} --workers {threads} 2> {log}"

elif CORPUS["name"] == "folder":
    # Your own recordings (docs/own-corpus.md; src/arnar/corpus/recipes/folder.py).
    from arnar.corpus.recipes.folder import folder_fingerprint

    if not os.path.isdir(CORPUS["path"]) and not os.path.isdir(f"{DATA}/corpus"):
        raise WorkflowError(f"params.yaml: corpus.path: {CORPUS['path']!r}: no such folder")

    rule folder_corpus:
        """Lay out the folder of your recordings as the corpus folder: speakers from sub-folders,
        transcripts from .txt files or metadata.csv, audio resampled to corpus.sample_rate;
        broken or unpaired items go through for ingest to quarantine."""
        output:
            corpus=directory(f"{DATA}/corpus"),
        params:
            path=CORPUS["path"],
            # the folder's file names, sizes and times: a changed folder rebuilds the corpus
            fingerprint=folder_fingerprint(CORPUS["path"]),
            test_speakers=CORPUS["test_speakers"],
            sample_rate=CORPUS["sample_rate"],
            seed=P["seed"],
        threads: P["workers"]
        log:
            f"{LOGS}/folder_corpus.log",
        conda:
            CORE_ENV
        shell:
            "arnar corpus prepare --corpus folder --path {params.path:q} --out {output.corpus}"
            " --sample-rate {params.sample_rate} --test-speakers {params.test_speakers}"
            " --seed {params.seed} --workers {threads} 2> {log}"

else:
    # Downloaded corpora (src/arnar/corpus/recipes): every archive the corpus needs is downloaded,
    # verified and extracted once into corpus.download_dir (shared by the profiles; a dry run
    # never downloads), then laid out as the corpus folder that the manifests rule ingests.
    from arnar.corpus.recipes import required_archives

    DOWNLOADS = CORPUS["download_dir"]
    try:
        CORPUS_ARCHIVES = required_archives(CORPUS["name"], CORPUS["libritts_parts"],
                                            mirrors=CORPUS["mirrors"], mls_audio=CORPUS["mls"]["audio"])
    except CorpusError as err:
        raise WorkflowError(f"params.yaml: {err}")
    MLS = CORPUS["mls"]
    # Brouhaha (the MLS filter's estimator) wants a GPU; the offline estimator runs on CPUs.
    PREPARE_GPUS = int(CORPUS["name"] == "mls" and MLS["estimator"] != "offline")

    wildcard_constraints:
        source="libritts|librispeech|mls",
        part="[a-z0-9-]+",

    rule corpus_download:
        """Download one archive (HTTP Range resume), verify its checksum, extract it; the stamp
        records the URL, size, sha256 and what was verified."""
        output:
            stamp=f"{DOWNLOADS}/{{source}}/{{part}}.json",
        params:
            # <download_dir>/<source>/<part>.json: the extracted part lies next to its stamp
            download_dir=lambda wildcards, output: os.path.dirname(os.path.dirname(output.stamp)),
            openslr=CORPUS["mirrors"].get("openslr", ""),
            mls=CORPUS["mirrors"].get("mls", ""),
            mls_audio=MLS["audio"],
        log:
            f"{LOGS}/corpus_download_{{source}}_{{part}}.log",
        conda:
            CORE_ENV
        shell:
            "arnar corpus download --source {wildcards.source} --part {wildcards.part}"
            " --download-dir {params.download_dir} --mls-audio {params.mls_audio}"
            " --mirror-openslr '{params.openslr}' --mirror-mls '{params.mls}' 2> {log}"

    rule corpus_prepare:
        """Lay out the downloaded sources as the corpus folder: LibriTTS (and filtered MLS)
        readers for training, LibriSpeech test-clean readers as the test set; audio resampled
        to corpus.sample_rate."""
        input:
            stamps=[f"{DOWNLOADS}/{a.source}/{a.part}.json" for a in CORPUS_ARCHIVES],
        output:
            corpus=directory(f"{DATA}/corpus"),
        params:
            name=CORPUS["name"],
            download_dir=lambda wildcards, input: os.path.dirname(os.path.dirname(input.stamps[0])),
            sample_rate=CORPUS["sample_rate"],
            parts=" ".join(CORPUS["libritts_parts"]),
            mls_audio=MLS["audio"],
            mls_estimator=MLS["estimator"],
            mls_model=MLS["brouhaha_model"],
            mls_min_snr=MLS["min_snr"],
            mls_min_c50=MLS["min_c50"],
        threads: P["workers"]
        resources:
            gpu=PREPARE_GPUS,
        log:
            f"{LOGS}/corpus_prepare.log",
        conda:
            CORE_ENV
        shell:
            "arnar corpus prepare --corpus {params.name} --download-dir {params.download_dir}"
            " --out {output.corpus} --sample-rate {params.sample_rate} --libritts-parts {params.parts}"
            " --mls-audio {params.mls_audio} --mls-estimator {params.mls_estimator}"
            " --mls-brouhaha-model '{params.mls_model}' --mls-min-snr {params.mls_min_snr}"
            " --mls-min-c50 {params.mls_min_c50} --workers {threads} 2> {log}"


rule manifests:
    """Validate every item, quarantine the bad ones with their reason, write lhotse manifests."""
    input:
        corpus=f"{DATA}/corpus",
    output:
        manifests=expand(
            "{data}/manifests/{split}_{kind}.jsonl",
            data=DATA,
            split=["train", "dev", "test"],
            kind=["recordings", "supervisions", "cuts"],
        ),
        quarantine=f"{DATA}/manifests/quarantine.tsv",
        summary=f"{DATA}/manifests/summary.json",
    params:
        out=lambda wildcards, output: os.path.dirname(output.summary),
        sample_rate=CORPUS["sample_rate"],
        dev_fraction=CORPUS["dev_fraction"],
        seed=P["seed"],
        **VALIDATION,
    threads: P["workers"]
    log:
        f"{LOGS}/manifests.log",
    conda:
        CORE_ENV
    shell:
        "arnar ingest --corpus {input.corpus} --out {params.out}"
        " --sample-rate {params.sample_rate} --min-duration {params.min_duration}"
        " --max-duration {params.max_duration} --silence-dbfs {params.silence_dbfs}"
        " --clip-fraction {params.clip_fraction} --dev-fraction {params.dev_fraction}"
        " --seed {params.seed} --workers {threads} 2> {log}"


rule tokenizers:
    """Train the BPE tokenizer on training transcripts; build the CMUdict phoneme tokenizer."""
    input:
        supervisions=f"{DATA}/manifests/train_supervisions.jsonl",
    output:
        bpe=f"{DATA}/tokenizers/bpe.model",
        bpe_vocab=f"{DATA}/tokenizers/bpe.vocab",
        phonemes=f"{DATA}/tokenizers/phonemes.json",
        report=f"{RESULTS}/data/tokenizers.json",
    params:
        vocab_size=P["text"]["bpe_vocab_size"],
        seed=P["seed"],
    log:
        f"{LOGS}/tokenizers.log",
    # every training run reads the text units (align.smk's priority does not reach upstream): on
    # speak the ground truth's evaluations held them up by 2.6 min
    priority: 1
    conda:
        CORE_ENV
    shell:
        "arnar tokenizers --supervisions {input.supervisions} --bpe {output.bpe}"
        " --phonemes {output.phonemes} --report {output.report}"
        " --bpe-vocab-size {params.vocab_size} --seed {params.seed} 2> {log}"


rule corpus_report:
    """Publish the corpus and quarantine figures where results live (DVC metrics)."""
    input:
        summary=f"{DATA}/manifests/summary.json",
        quarantine=f"{DATA}/manifests/quarantine.tsv",
        corpus=f"{DATA}/corpus",
    output:
        stats=report(f"{RESULTS}/data/corpus.json", caption="../report/corpus.rst", category="Data"),
        quarantine=report(
            f"{RESULTS}/data/quarantine.tsv", caption="../report/quarantine.rst", category="Data"
        ),
    log:
        f"{LOGS}/corpus_report.log",
    conda:
        CORE_ENV
    shell:
        "arnar corpus-report --summary {input.summary} --quarantine {input.quarantine}"
        " --corpus {input.corpus} --out {output.stats} --quarantine-out {output.quarantine} 2> {log}"


rule data:
    """Target of the data phase (dvc.yaml stage `data`)."""
    input:
        rules.tokenizers.output,
        rules.corpus_report.output,
