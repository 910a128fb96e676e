"""Paradigms: each is one module saying how it builds a training example, its loss and its
decoding loop (:mod:`arnar.paradigms.base`). ``build_paradigm(name, vocab, model, **options)``
imports ``arnar.paradigms.<name>`` on first use, so a new paradigm needs no edit here."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from arnar.paradigms.base import Paradigm, Vocab

PARADIGMS: dict[str, type[Paradigm]] = {}
# the paradigm modules of this package (the error message's list of names; none is imported here)
KNOWN = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"))


def register_paradigm(cls: type[Paradigm]) -> type[Paradigm]:
    """Class decorator: make ``cls`` buildable under ``cls.name``."""
    PARADIGMS[cls.name] = cls
    return cls


def paradigm_class(name: str) -> type[Paradigm]:
    if name not in PARADIGMS:
        try:
            importlib.import_module(f"arnar.paradigms.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"arnar.paradigms.{name}":
                raise
        if name not in PARADIGMS:
            raise ValueError(f"unknown paradigm {name!r}; known: {', '.join(sorted(set(KNOWN) | set(PARADIGMS)))}")
    return PARADIGMS[name]


def build_paradigm(name: str, vocab: Vocab, model: Any, **options: Any) -> Paradigm:
    return paradigm_class(name)(vocab, model, **options)
