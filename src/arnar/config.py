"""Load params.yaml, validate it against the schema and resolve the selected profile.

The same function serves the Snakefile and every CLI, so a config is interpreted one way only.
Resolution: the top-level sections (corpus, validation, text, ...) are the base; the preset
named by ``profile`` overrides them key by key (a deep merge); ``profiles`` itself is dropped
from the resolved config so downstream code sees one flat experiment.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "params.schema.yaml"
TRAIN_CONF_DIR = Path(__file__).resolve().parent / "conf"  # arnar.train's Hydra configs
# params keys that name a file: (section, key) -> the folder the named Hydra config must be in.
# Checked on load, so a typo stops `snakemake -n` naming the key instead of failing the first
# training job after the data phase has run.
CONFIG_FILE_KEYS = {("training", "model"): "model", ("training", "recipe"): "train"}
# keys that take either a hub id or a local weights file: a value written as a path must exist
WEIGHTS_KEYS = [("corpus", "mls", "brouhaha_model")]
WEIGHTS_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".safetensors")


class ConfigError(ValueError):
    """A params file that is missing, unreadable or does not match the schema."""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated by ``override``; nested mappings merge, everything else replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _short_validation_message(message: str) -> str:
    """Reduce snakemake's multi-page jsonschema dump to 'where: what'.

    The dump has a line 'ValidationError: <what>' and a line "On instance['a']['b']:" that
    names the offending key; the schema excerpt between them is noise to a user.
    """
    what = next((l.split(":", 1)[1].strip() for l in message.splitlines()
                 if l.startswith("ValidationError:")), message.strip())
    where = next((l.strip()[len("On instance"):].rstrip(":") for l in message.splitlines()
                  if l.strip().startswith("On instance")), "")
    keys = [k.strip("'\"") for k in where.strip("[]").split("][") if k]
    return f"{'.'.join(keys) or '<top level>'}: {what}"


def validate_params(config: Mapping[str, Any], schema_path: Path = SCHEMA_PATH) -> None:
    """Validate a raw (unresolved) config; raise ConfigError whose message names the key."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    try:
        # validate() fills defaults in place; work on a copy so callers keep what they passed.
        validate(copy.deepcopy(dict(config)), str(schema_path), set_default=False)
    except WorkflowError as err:
        raise ConfigError(_short_validation_message(str(err))) from None
    profile = config["profile"]
    if profile not in config["profiles"]:
        raise ConfigError(
            f"profile: {profile!r} is not one of the presets under 'profiles' "
            f"({', '.join(sorted(config['profiles']))})"
        )


def resolve_profile(config: Mapping[str, Any], schema_path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """Validate ``config`` and return it with its profile's preset merged in."""
    validate_params(config, schema_path)
    preset = config["profiles"][config["profile"]]
    resolved = deep_merge({k: v for k, v in config.items() if k != "profiles"}, preset)
    # The merged result must still be a valid experiment (a preset can break a constraint).
    check = dict(resolved, profiles=config["profiles"])
    validate_params(check, schema_path)
    validation = resolved["validation"]
    if validation["min_duration"] >= validation["max_duration"]:
        raise ConfigError(
            "validation: min_duration "
            f"({validation['min_duration']}) must be below max_duration ({validation['max_duration']})"
        )
    corpus = resolved["corpus"]
    if corpus["name"] == "synth" and corpus["test_speakers"] >= corpus["speakers"]:
        raise ConfigError(
            f"corpus: test_speakers ({corpus['test_speakers']}) must be fewer than speakers "
            f"({corpus['speakers']}) so that some speakers are left for training"
        )
    if corpus["name"] == "folder" and not corpus["path"]:
        raise ConfigError("corpus.path: corpus.name 'folder' needs the folder of your recordings "
                          "(docs/own-corpus.md)")
    check_oracle_timings(resolved)
    check_named_files(resolved)
    return resolved


def check_oracle_timings(resolved: Mapping[str, Any]) -> None:
    """Oracle timings (the ``.align.json`` beside each utterance) exist for synth only: another
    corpus must align with a real aligner and cannot score it against them."""
    name, alignment = resolved["corpus"]["name"], resolved["alignment"]
    if name == "synth":
        return
    for key in ("aligner", "train_aligner"):
        if alignment[key] == "oracle":
            raise ConfigError(f"alignment.{key}: 'oracle' reads the synthesizer's own timings, which corpus.name "
                              f"{name!r} does not have; use pocketsphinx or mfa")
    if alignment["score_splits"]:
        raise ConfigError(f"alignment.score_splits: {alignment['score_splits']} scores the aligner against the "
                          f"synthesizer's own timings, which corpus.name {name!r} does not have; set it to []")


def check_named_files(resolved: Mapping[str, Any]) -> None:
    """Every key that names a file must name one that exists (the message names the key)."""
    for (section, key), group in CONFIG_FILE_KEYS.items():
        name = resolved[section][key]
        path = TRAIN_CONF_DIR / group / f"{name}.yaml"
        if not path.is_file():
            choices = sorted(p.stem for p in (TRAIN_CONF_DIR / group).glob("*.yaml"))
            raise ConfigError(
                f"{section}.{key}: {name!r} names no config file ({path} does not exist; "
                f"choose one of {', '.join(choices)})"
            )
    for keys in WEIGHTS_KEYS:
        value: Any = resolved
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        # a hub id ("owner/name") is fetched later; a path (absolute, ./ or ../, or a weights
        # file's suffix) is the user's own file, relative to the workflow root
        if isinstance(value, str) and (value.startswith(("/", "./", "../", "~")) or value.endswith(WEIGHTS_SUFFIXES)):
            if not Path(value).expanduser().is_file():
                raise ConfigError(f"{'.'.join(keys)}: {value!r}: no such weights file")


def load_params(
    path: str | Path = REPO_ROOT / "params.yaml", overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Read a params file, apply ``overrides`` (e.g. {"profile": "smoke"}) and resolve it."""
    path = Path(path)
    schema_path = path.resolve().parent / "workflow" / "schemas" / "params.schema.yaml"
    if not schema_path.exists():
        schema_path = SCHEMA_PATH
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: params file not found") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    if overrides:
        raw = deep_merge(raw, overrides)
    try:
        return resolve_profile(raw, schema_path)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
