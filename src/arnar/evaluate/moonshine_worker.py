"""The child process that runs Moonshine for :class:`arnar.evaluate.asr.MoonshineAsr`.

moonshine-cpp's library keeps ~50 MB of every ``moonshine_transcribe`` call, so the parent runs
the model here and replaces this process every few clips (its memory is returned with it). It is
started as ``python -m arnar.evaluate.moonshine_worker <model folder>`` rather than through
``multiprocessing``, whose spawn start re-runs the caller's main script (a script without a
``__main__`` guard would start workers without end).

Protocol on stdin/stdout, binary: the parent writes ``<u64 n><u64 max_samples><n float32>`` per
clip; the worker answers ``<u64 length><utf-8 text>``. ``n = 0`` with ``max_samples = 0`` ends it.
Once its model is loaded the worker answers ``READY`` (or ``ERROR: <why>`` and exits).
"""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import numpy as np

HEADER = struct.Struct("<QQ")
LENGTH = struct.Struct("<Q")


class MoonshineModel:
    """The wheel's C library with one loaded model; the clip goes in as a float32 pointer (the
    wheel's own Python array path is broken: it calls ``ctypes.c_float_p``)."""

    def __init__(self, folder: str):
        import moonshine_cpp

        from arnar.evaluate.asr import MOONSHINE_FILES

        self.lib = moonshine_cpp.moonshine_lib
        paths = [str(Path(folder) / f).encode("utf-8") for f in MOONSHINE_FILES]
        self.handle = self.lib.moonshine_load_model(*paths, moonshine_cpp.MOONSHINE_MODEL_TYPE_BASE)
        if self.handle < 0:
            raise RuntimeError(f"Moonshine could not load the models in {folder}")

    def close(self) -> None:
        if self.handle >= 0:
            self.lib.moonshine_free_model(self.handle)
            self.handle = -1

    def transcribe(self, clip: np.ndarray, max_samples: int) -> str:
        from arnar.evaluate.asr import split_at_pauses

        pieces = [self._decode(clip[a:b]) for a, b in split_at_pauses(clip, max_samples)]
        return " ".join(p for p in pieces if p)

    def _decode(self, clip: np.ndarray) -> str:
        if clip.size == 0:
            return ""
        samples = np.ascontiguousarray(np.clip(clip, -1.0, 1.0), dtype=np.float32)
        text = ctypes.c_char_p(0)
        error = self.lib.moonshine_transcribe(self.handle, samples.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                              samples.size, ctypes.byref(text))
        if error != 0:
            raise RuntimeError(f"Moonshine failed on a {samples.size / 16000:.2f} s clip (error {error})")
        out = (text.value or b"").decode("utf-8").strip()
        self.lib.moonshine_free_text(text)
        return out


def _answer(out, text: str) -> None:
    data = text.encode("utf-8")
    out.write(LENGTH.pack(len(data)) + data)
    out.flush()


def main(folder: str) -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    try:
        model = MoonshineModel(folder)
    except Exception as err:  # the parent raises it with the folder's name
        _answer(stdout, f"ERROR: {err}")
        return
    _answer(stdout, "READY")
    while True:
        header = stdin.read(HEADER.size)
        if len(header) < HEADER.size:
            break
        n, max_samples = HEADER.unpack(header)
        if n == 0 and max_samples == 0:
            break
        clip = np.frombuffer(stdin.read(4 * n), dtype=np.float32) if n else np.zeros(0, np.float32)
        try:
            _answer(stdout, model.transcribe(clip, max_samples))
        except Exception as err:
            _answer(stdout, f"ERROR: {err}")
    model.close()


if __name__ == "__main__":
    main(sys.argv[1])
