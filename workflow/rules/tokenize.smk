# Speech-token phase: train the offline codec (embedded default), tokenize every split, and
# resynthesize the test lists through each codec that decodes (the reference rows).
#
# codec.tokenizers lists the token sets to build: offline (25 Hz semantic, single stream),
# offline_rvq (50 Hz residual stack for Chain-of-Details) — both from the model this phase
# trains — or s3 / dac, whose packages fetch their pretrained weights on a connected machine.

CODEC = P["codec"]

# The codec's training computes the front end (Moonshine's encoder) of every train-split clip,
# which is most of what tokenizing that split costs, so it writes the train split's 25 Hz token
# set itself (7 of the speak DAG's thread-minutes); the tokenize rule makes the other sets.
CODEC_WRITES_TRAIN_TOKENS = "offline" in CODEC["tokenizers"]
CODEC_TRAIN_TOKENS = {"train_tokens": f"{DATA}/tokens/offline/train/manifest.json"} if CODEC_WRITES_TRAIN_TOKENS else {}

ruleorder: train_codec > tokenize

rule train_codec:
    """Train the offline codec: phone-supervised 25 Hz tokens, an RVQ stack, a prompted decoder."""
    input:
        cuts=f"{DATA}/manifests/train_cuts.jsonl",
        alignments=CODEC_LABELS,  # the aligner's phones (align.smk: all of train, or a subset)
    output:
        model=directory(f"{DATA}/codec/offline"),
        **CODEC_TRAIN_TOKENS,
    params:
        sizes=json.dumps(CODEC["offline"], sort_keys=True),
        seed=P["seed"],
        tokens=f"--tokens-out {DATA}/tokens/offline --tokens-split train" if CODEC_WRITES_TRAIN_TOKENS else "",
    threads: 2
    log:
        f"{LOGS}/train_codec.log",
    priority: 1  # as align: training waits for the codec and its tokens
    conda:
        CORE_ENV
    shell:
        "arnar train-codec --cuts {input.cuts} --alignments {input.alignments} --out {output.model}"
        " --sizes '{params.sizes}' --seed {params.seed} --threads {threads} {params.tokens} 2> {log}"


rule tokenize:
    """Encode one split with one codec into token shards (manifest records the codec's hash)."""
    input:
        cuts=f"{DATA}/manifests/{{split}}_cuts.jsonl",
        model=lambda wildcards: codec_model(wildcards.codec),
    output:
        manifest=f"{DATA}/tokens/{{codec}}/{{split}}/manifest.json",
    params:
        out=lambda wildcards, output: os.path.dirname(os.path.dirname(output.manifest)),
        model=lambda wildcards, input: f"--model {input.model}" if input.model else "",
    wildcard_constraints:
        split="train|dev|test",
        codec="offline|offline_rvq|s3|dac",
    resources:
        gpu=lambda wildcards: int(wildcards.codec in ("s3", "dac")),  # hub codecs: a GPU on a cluster
    log:
        f"{LOGS}/tokenize_{{codec}}_{{split}}.log",
    priority: 1  # as align
    conda:
        CORE_ENV
    shell:
        "arnar tokenize --codec {wildcards.codec} {params.model} --cuts {input.cuts}"
        " --split {wildcards.split} --out {params.out} 2> {log}"


rule resynthesize:
    """Test-list targets -> tokens -> audio, with the item's prompt for the voice."""
    input:
        testlist=f"{DATA}/eval/testlists/{{task}}.tsv",
        targets=f"{DATA}/systems/ground_truth/{{task}}",
        prompts=f"{DATA}/eval/prompts/{{task}}",
        model=lambda wildcards: codec_model(resynthesis_codec(wildcards.codec)),
    output:
        system=directory(f"{DATA}/systems/resynth_{{codec}}/{{task}}"),
    params:
        model=lambda wildcards, input: f"--model {input.model}" if input.model else "",
        # offline_rvq_q1: the RVQ stack's first quantizer alone, the decoding path of Chain-of-Details;
        # <codec>_hifigan: the same tokens turned into audio by HiFi-GAN instead of Griffin-Lim
        codec=lambda wildcards: resynthesis_codec(wildcards.codec),
        n_codebooks=lambda wildcards: "--n-codebooks 1" if wildcards.codec.removesuffix("_hifigan").endswith("_q1") else "",
        vocoder=lambda wildcards: "--vocoder hifigan" if wildcards.codec.endswith("_hifigan") else "",
    wildcard_constraints:
        codec="offline|offline_rvq|offline_rvq_q1|dac|offline_hifigan|offline_rvq_hifigan|offline_rvq_q1_hifigan",
    log:
        f"{LOGS}/resynthesize_{{codec}}_{{task}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar resynthesize --codec {params.codec} {params.model} {params.n_codebooks} {params.vocoder}"
        " --testlist {input.testlist}"
        " --targets {input.targets} --prompts {input.prompts} --out {output.system} 2> {log}"


rule tokens:
    """Target of the token phase (dvc.yaml stage `tokenize`)."""
    input:
        expand("{data}/tokens/{codec}/{split}/manifest.json", data=DATA, codec=CODEC["tokenizers"],
               split=["train", "dev", "test"]),
