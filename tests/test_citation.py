"""LICENSE and CITATION.cff: MIT, and citation metadata in the shape CFF 1.2.0 asks for.

cffconvert (the format's validator) is not a dependency; `cffconvert --validate -i CITATION.cff`
checks the full schema where it is installed. These checks cover the structure by hand.
"""

import re
import tomllib

import yaml

from arnar.config import REPO_ROOT

CFF = yaml.safe_load((REPO_ROOT / "CITATION.cff").read_text(encoding="utf-8"))
PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# the keys CFF 1.2.0 allows at the top level
CFF_KEYS = {"abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers",
            "keywords", "license", "license-url", "message", "preferred-citation", "references", "repository",
            "repository-artifact", "repository-code", "title", "type", "url", "version"}
PAPERS = {"2502.11094", "2504.10352", "2604.19330", "2409.00750", "2301.02111", "2412.10117"}


def test_license_is_mit():
    text = (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n") and "Copyright (c) 2026 the arnar authors" in text
    assert PROJECT["license"] in ({"text": "MIT"}, "MIT")


def test_citation_has_the_required_keys():
    assert set(CFF) <= CFF_KEYS
    assert {"cff-version", "message", "title", "authors"} <= set(CFF)
    assert CFF["cff-version"] == "1.2.0" and CFF["title"] == "arnar" and CFF["type"] == "software"
    assert CFF["authors"] == [{"name": "The arnar authors"}]
    assert CFF["license"] == "MIT"
    assert CFF["version"] == PROJECT["version"]
    assert isinstance(CFF["date-released"], str) and CFF["date-released"] == "2026-12-06"


def test_references_name_the_reproduced_papers():
    arxiv = set()
    for ref in CFF["references"]:
        assert {"type", "title", "authors"} <= set(ref), ref
        assert all("name" in a or "family-names" in a for a in ref["authors"]), ref
        ids = [i["value"] for i in ref.get("identifiers", [])]
        arxiv |= {i.removeprefix("arXiv:") for i in ids if i.startswith("arXiv:")}
        if "doi" in ref:
            assert re.fullmatch(r"10\.48550/arXiv\.\d{4}\.\d{5}", ref["doi"]) and ref["doi"].endswith(ref["url"][-10:])
    assert arxiv == PAPERS
    delta = next(r for r in CFF["references"] if r["title"].startswith("DELTA-TTS"))
    assert delta["url"] == "https://openreview.net/forum?id=v2DbAIl7sf"
