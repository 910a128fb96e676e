"""params.yaml: validation against the schema and profile resolution."""

import copy

import pytest
import yaml

from arnar.config import REPO_ROOT, ConfigError, deep_merge, load_params, resolve_profile

RAW = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


def test_every_profile_resolves():
    for profile in ("smoke", "mini", "libritts"):
        config = load_params(overrides={"profile": profile})
        assert config["profile"] == profile
        assert "profiles" not in config


def test_preset_overrides_key_by_key():
    smoke = load_params(overrides={"profile": "smoke"})
    preset = RAW["profiles"]["smoke"]["corpus"]
    assert smoke["corpus"]["speakers"] == preset["speakers"]
    # a key the preset does not name keeps the top-level value
    assert smoke["corpus"]["sample_rate"] == RAW["corpus"]["sample_rate"]
    assert smoke["validation"] == RAW["validation"]


def test_mini_profile_meets_corpus_floors():
    mini = load_params(overrides={"profile": "mini"})["corpus"]
    assert mini["speakers"] >= 20 and mini["test_speakers"] >= 4


def test_deep_merge_does_not_mutate():
    base = {"a": {"b": 1, "c": 2}, "d": 3}
    before = copy.deepcopy(base)
    assert deep_merge(base, {"a": {"b": 9}}) == {"a": {"b": 9, "c": 2}, "d": 3}
    assert base == before


@pytest.mark.parametrize(
    "override, message",
    [
        ({"corpus": {"speakrs": 3}}, "corpus: Additional properties are not allowed ('speakrs' was unexpected)"),
        ({"seed": "abc"}, "seed: 'abc' is not of type 'integer'"),
        ({"profile": "nope"}, "profile: 'nope' is not one of the presets"),
        ({"profiles": {"smoke": {"text": {"bpe_vocab_size": 1.5}}}}, "profiles.smoke.text.bpe_vocab_size"),
        ({"workers": 0}, "workers: 0 is less than the minimum of 1"),
        ({"extra_section": {}}, "<top level>: Additional properties are not allowed ('extra_section'"),
        ({"validation": {"min_duration": 40.0}}, "min_duration (40.0) must be below max_duration"),
        ({"profiles": {"speak": {"corpus": {"test_speakers": 30}}}}, "test_speakers (30) must be fewer than speakers"),
    ],
)
def test_schema_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_params(overrides=override)
    assert message in str(info.value)
    assert str(REPO_ROOT / "params.yaml") in str(info.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_params(tmp_path / "absent.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("profile: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_params(bad)


def test_missing_required_section():
    raw = {k: v for k, v in RAW.items() if k != "text"}
    with pytest.raises(ConfigError, match="'text' is a required property"):
        resolve_profile(raw)
