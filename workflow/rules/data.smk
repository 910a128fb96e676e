# Data phase: corpus -> validated lhotse manifests (+ quarantine report) -> text tokenizers.

CORPUS = P["corpus"]
VALIDATION = P["validation"]

if CORPUS["name"] != "synth":
    corpus_recipe_rule_missing(CORPUS["name"])


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
