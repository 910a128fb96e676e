"""docs/configuration.md is generated from the schema and params.yaml, and kept current."""

import pytest
import yaml

from arnar.cli import main
from arnar.config import REPO_ROOT, SCHEMA_PATH, load_params
from arnar.config_docs import COMMAND, DOC_PATH, flow, missing_descriptions, render_config_docs, type_text

SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))


def test_committed_page_is_current():
    page = REPO_ROOT / DOC_PATH
    committed = page.read_text(encoding="utf-8") if page.is_file() else ""
    if committed != render_config_docs(REPO_ROOT / "params.yaml"):
        pytest.fail(f"{DOC_PATH} is stale (the schema or params.yaml changed): run `{COMMAND}` and commit it")


def test_every_schema_key_has_a_description():
    missing = missing_descriptions(SCHEMA)
    assert not missing, f"give these properties a description in {SCHEMA_PATH.name}: {', '.join(missing)}"


def test_every_key_is_on_the_page():
    page = render_config_docs()

    def keys(section: dict, prefix: str):
        for name, value in section.items():
            yield f"{prefix}{name}"
            if isinstance(value, dict) and name not in ("offline", "overrides", "decoding"):
                yield from keys(value, f"{prefix}{name}.")

    raw = yaml.safe_load((REPO_ROOT / "params.yaml").read_text(encoding="utf-8"))
    sections = {f"## {name}" for name, value in raw.items() if isinstance(value, dict)}  # profiles too
    absent = [k for k in keys({k: v for k, v in raw.items() if k != "profiles"}, "")
              if f"| `{k}` |" not in page and f"## {k}" not in sections]
    assert not absent and all(f"\n{heading}\n" in page for heading in sections)


def test_rows_show_type_default_profiles_and_meaning():
    page = render_config_docs()
    row = next(line for line in page.splitlines() if line.startswith("| `text.bpe_vocab_size` |"))
    assert row == ("| `text.bpe_vocab_size` | integer (≥ 32) | `2000` | smoke: `300`; mini: `1000`; libritts: `2000` "
                   "| BPE vocabulary size (clamped to what the corpus supports) |")
    # a key no preset names has an empty profiles cell; a key set only by presets has no default
    assert "| `evaluation.d_llm` | number (≥ 0) | `0.025` |  |" in page
    assert "| `training.grids.syncspeech_speech_top_k` | non-empty list of integers (≥ 1) | — | mini: `[1, 3]`;" in page


def test_type_and_value_words():
    root = {"$defs": {"n": {"type": "integer", "minimum": 1}}}
    assert type_text({"$ref": "#/$defs/n"}, root) == "integer (≥ 1)"
    assert type_text({"type": ["integer", "null"], "minimum": 1}, root) == "integer (≥ 1) or null"
    assert type_text({"enum": [None, "a"]}, root) == "one of `null`, `a`"
    assert type_text({"type": "array", "minItems": 1, "items": {"enum": [1, 2]}}, root) == \
        "non-empty list of values from `1`, `2`"
    assert type_text({"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
                     root) == "mapping of name → list of strings"
    assert type_text({"type": "string", "minLength": 1}, root) == "non-empty string"
    assert [flow(v) for v in (None, True, 0.5, "a b", "", [1, "x"], {"k": [1]})] == \
        ["null", "true", "0.5", "a b", "''", "[1, x]", "{k: [1]}"]


def test_command_writes_the_page(tmp_path):
    out = tmp_path / "configuration.md"
    assert main(["config-docs", "--params", str(REPO_ROOT / "params.yaml"), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_config_docs()


@pytest.mark.parametrize("profile", ["speak", "smoke", "mini", "libritts"])
def test_descriptions_are_annotations_only(profile):
    """A description changes nothing that validation accepts: every profile still resolves."""
    assert load_params(overrides={"profile": profile})["profile"] == profile
