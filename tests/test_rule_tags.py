"""Rule tags follow one scheme: ``AREA-NAME``, AREA one of a fixed set, each rule one name, each rule under
its area's heading in docs/design.md (the document is ordered by principle, and the tag says where a rule
lives). tests/test_layout.py binds each tag to the code that carries it; this binds the names themselves.

Pure reading: no process is started."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
AREAS = {
    "TURN",
    "LADDER",
    "TREE",
    "WORKER",
    "MEM",
    "EVENTS",
    "LINK",
    "DAEMON",
    "CLIENT",
    "JOURNAL",
    "API",
    "CLI",
    "BATCH",
    "HTTP",
    "ACP",
    "SEC",
    "OBS",
    "LOOP",
    "ADAPT",
    "TOOL",
    "RAY",
}
RULE = re.compile(r"^\*\*([A-Za-z0-9-]+) — ", re.M)
SCHEME = re.compile(r"^([A-Z]+)(?:-[A-Z]+)+$")


def test_every_rule_tag_is_area_name_with_a_known_area() -> None:
    wrong = []
    for doc in sorted(DOCS.glob("*.md")):
        for tag in RULE.findall(doc.read_text()):
            match = SCHEME.match(tag)
            if not match or match.group(1) not in AREAS:
                wrong.append(f"{doc.name}: {tag}")
    assert wrong == []


def test_each_rule_has_one_name_and_sits_under_its_area() -> None:
    design = (DOCS / "design.md").read_text()
    tags = RULE.findall(design)
    assert len(tags) > 100
    assert sorted({t for t in tags if tags.count(t) > 1}) == []
    mixed = []
    for section in re.split(r"^## ", design, flags=re.M)[1:]:
        areas = {tag.split("-")[0] for tag in RULE.findall(section)}
        if len(areas) > 1:
            mixed.append(f"{section.splitlines()[0]}: {sorted(areas)}")
    assert mixed == [], "a design.md section holds rules of several areas"


def test_a_rule_written_in_two_documents_is_the_same_rule() -> None:
    """A tag defined in a guide (docs/http.md's rules) and in design.md names one rule: the guide says so."""
    design = set(RULE.findall((DOCS / "design.md").read_text()))
    for doc in sorted(DOCS.glob("*.md")):
        if doc.name == "design.md":
            continue
        text = doc.read_text()
        for tag in set(RULE.findall(text)) & design:
            paragraph = text.split(f"**{tag} — ", 1)[1].split("\n\n", 1)[0]
            assert "design.md" in paragraph, f"{doc.name}: {tag} is also a rule of design.md, and says not so"
