"""docs/configuration.md, generated: every key of params.yaml with its type, default, profiles and meaning.

The page is never edited by hand. Types and meanings come from the schema
(workflow/schemas/params.schema.yaml: each property's ``description``), defaults from the
top-level values of params.yaml, and the profiles column from its presets (a preset overrides the
top-level sections key by key, as :func:`arnar.config.resolve_profile` merges them).
``arnar config-docs --out docs/configuration.md`` rewrites the page; tests/test_config_docs.py
fails while the committed page differs from what :func:`render_config_docs` returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from arnar.config import REPO_ROOT, SCHEMA_PATH, ConfigError, validate_params

DOC_PATH = "docs/configuration.md"
COMMAND = f"arnar config-docs --out {DOC_PATH}"
# a profile's value longer than this is summarised in the table (the full value is in params.yaml)
LONG = 80
MISSING = "—"
PLURAL = {"integer": "integers", "number": "numbers", "string": "strings", "boolean": "booleans"}
BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))

INTRO = """\
Every experiment value lives in `params.yaml`, which is validated against
`workflow/schemas/params.schema.yaml` on every load: a wrong key or type stops the run with a
message naming the key. `profile` picks one of the presets under `profiles`. A preset overrides
the top-level sections key by key (nested mappings merge, anything else is replaced), and a key
it does not name keeps its top-level value. Pick a profile on the command line with
`snakemake --cores all --config profile=smoke`; `arnar config --profile smoke` prints the
resolved config.

In the tables, **Default** is the top-level value in `params.yaml` ({missing} where the file
does not set the key) and **Profiles** lists the presets that override it, with their value;
where a preset sets a key, its value beats the default. The file's presets: {presets}.
"""


def schema_path_for(params_path: Path) -> Path:
    """The schema beside a params file (workflow/schemas/ next to it), else the package's (as
    :func:`arnar.config.load_params` finds it)."""
    beside = Path(params_path).resolve().parent / "workflow" / "schemas" / "params.schema.yaml"
    return beside if beside.exists() else SCHEMA_PATH


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    """A schema node with its ``$ref`` and ``allOf`` parts merged in (its own keys win)."""
    merged: dict[str, Any] = {}
    if "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise ConfigError(f"schema: only local references are documented, got {ref!r}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        merged.update(_resolve(target, root))
    for part in node.get("allOf", []):
        resolved = _resolve(part, root)
        merged["properties"] = {**merged.get("properties", {}), **resolved.pop("properties", {})}
        merged.update({k: v for k, v in resolved.items() if k not in merged})
    merged.update({k: v for k, v in node.items() if k not in ("$ref", "allOf")})
    return merged


def iter_properties(node: Mapping[str, Any], root: Mapping[str, Any],
                    path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """(dotted path, resolved schema) of every property, parents before their keys, in schema order."""
    for name, child in _resolve(node, root).get("properties", {}).items():
        resolved = _resolve(child, root)
        yield (*path, name), resolved
        yield from iter_properties(resolved, root, (*path, name))


def missing_descriptions(schema: Mapping[str, Any]) -> list[str]:
    """Dotted names of the properties whose schema gives no ``description``, in the schema's $defs too."""
    missing = [".".join(path) for path, node in iter_properties(schema, schema)
               if not str(node.get("description", "")).strip()]
    for name, definition in schema.get("$defs", {}).items():
        missing += [".".join(("$defs", name, *path)) for path, node in iter_properties(definition, schema)
                    if not str(node.get("description", "")).strip()]
    return missing


def flow(value: Any) -> str:
    """A value in YAML flow style, as params.yaml writes it: [a, b], {k: v}, null, true, 0.5."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, str):  # plain where YAML reads it back as this string, else quoted
        return yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).removesuffix("...\n").strip()
    return repr(value)


def type_text(node: Mapping[str, Any], root: Mapping[str, Any], plural: bool = False) -> str:
    """A schema node in words: 'integer (≥ 1) or null', 'one of `a`, `b`', 'list of numbers (> 0)'."""
    node = _resolve(node, root)
    if "enum" in node:
        choices = ", ".join(f"`{flow(v)}`" for v in node["enum"])
        return f"values from {choices}" if plural else f"one of {choices}"
    if "const" in node:
        return f"`{flow(node['const'])}`"
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    nullable = "null" in types
    words = []
    for kind in [t for t in types if t != "null"] or (["mapping"] if "properties" in node else []):
        if kind == "array":
            items = type_text(node.get("items", {}), root, plural=True) or "values"
            words.append(("non-empty list" if node.get("minItems", 0) >= 1 else "list") + f" of {items}")
        elif kind in ("object", "mapping"):
            extra = node.get("additionalProperties")
            if "properties" in node:
                words.append("mapping (keys below)")
            elif isinstance(extra, Mapping):
                words.append(f"mapping of name → {type_text(extra, root)}")
            else:
                words.append("mapping")
        else:
            word = PLURAL.get(kind, kind) if plural else kind
            if kind == "string" and node.get("minLength", 0) >= 1:
                word = "non-empty " + word
            if "pattern" in node:
                word += f" matching `{node['pattern']}`"
            bounds = [f"{sign} {flow(node[key])}" for key, sign in BOUNDS if key in node]
            words.append(word + (f" ({', '.join(bounds)})" if bounds else ""))
    if nullable:
        words.append("null")
    return " or ".join(words)


def _lookup(mapping: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    for key in path:
        if not isinstance(mapping, Mapping) or key not in mapping:
            return False, None
        mapping = mapping[key]
    return True, mapping


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _paragraph(text: str) -> str:
    text = " ".join(str(text).split())
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") or not text else ".")


def _code(value: Any) -> str:
    return f"`{flow(value)}`"


def _profile_value(value: Any) -> str:
    text = flow(value)
    if len(text) <= LONG:
        return f"`{text}`"
    if isinstance(value, Mapping):
        return f"{len(value)} entries (see `params.yaml`)"
    return f"{len(value)} items (see `params.yaml`)" if isinstance(value, (list, tuple)) else "see `params.yaml`"


def _row(path: tuple[str, ...], node: Mapping[str, Any], root: Mapping[str, Any], params: Mapping[str, Any],
         presets: Mapping[str, Any]) -> str:
    found, value = _lookup(params, path)
    if "properties" in node:  # its keys have their own rows
        default = _code(value) if found and not value else (MISSING if not found else "keys below")
        profiles = ""
    else:
        default = _code(value) if found else MISSING
        profiles = "; ".join(f"{name}: {_profile_value(v)}" for name, preset in presets.items()
                             for hit, v in [_lookup(preset, path)] if hit)
    cells = [f"`{'.'.join(path)}`", type_text(node, root), default, profiles, node.get("description", "")]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(rows: list[str]) -> list[str]:
    return ["| Key | Type | Default | Profiles | Meaning |", "| --- | --- | --- | --- | --- |", *rows]


def render_config_docs(params_path: str | Path = REPO_ROOT / "params.yaml",
                       schema_path: str | Path | None = None) -> str:
    """The Markdown page documenting every key of the schema (see the module docstring)."""
    params_path = Path(params_path)
    schema_path = Path(schema_path) if schema_path else schema_path_for(params_path)
    try:
        params = yaml.safe_load(params_path.read_text(encoding="utf-8"))
        schema = yaml.safe_load(Path(schema_path).read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ConfigError(f"{err.filename}: not found") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{params_path} or {schema_path}: not valid YAML: {err}") from None
    try:
        validate_params(params, Path(schema_path))
    except ConfigError as err:
        raise ConfigError(f"{params_path}: {err}") from None
    presets = params["profiles"]
    lines = ["# Configuration", "",
             f"<!-- Generated from workflow/schemas/params.schema.yaml and params.yaml by `{COMMAND}`;",
             "     do not edit: change the schema's descriptions or params.yaml and run the command again. -->",
             "", INTRO.format(missing=MISSING, presets=", ".join(f"`{p}`" for p in presets)).rstrip(), ""]
    properties = list(iter_properties(schema, schema))
    top = [(p, n) for p, n in properties if len(p) == 1 and "properties" not in n and p != ("profiles",)]
    lines += ["## Top level", "", *_table([_row(p, n, schema, params, presets) for p, n in top]), ""]
    for (section,), node in [(p, n) for p, n in properties if len(p) == 1 and "properties" in n]:
        rows = [_row(p, n, schema, params, presets) for p, n in properties if len(p) > 1 and p[0] == section]
        lines += [f"## {section}", "", _paragraph(node.get("description", "")), "", *_table(rows), ""]
    profiles = dict(properties).get(("profiles",), {})
    lines += ["## profiles", "", _paragraph(profiles.get("description", "")), "",
              "| Preset | Sections it overrides |", "| --- | --- |"]
    lines += [f"| `{name}` | {_cell(', '.join(preset) or MISSING)} |" for name, preset in presets.items()]
    default = params.get("profile")
    lines += ["", f"`params.yaml` selects `{default}`"
              + (f"; the schema requires the presets {', '.join(f'`{r}`' for r in profiles.get('required', []))}."
                 if profiles.get("required") else "."), ""]
    return "\n".join(lines)
