"""docs/findings.md is organised by topic, not a diary: no work-log numbering, no dates and no
commit hashes except the one its first line names as the diary it was distilled from."""
import re
from pathlib import Path

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings.md"
WORK_LOG = [r"\bsession \d+", r"\bsessions? \d+ and \d+", r"\b20\d\d-\d\d-\d\d\b", r"\btoday\b", r"\byesterday\b",
            r"\bthe slower day\b", r"\b[0-9a-f]{7,40}\b"]


def work_log_lines(text: str) -> list[str]:
    """Lines after the first paragraph that read like a diary entry."""
    body = text.split("\n\n", 2)[-1]
    return [line for line in body.splitlines() if any(re.search(p, line, re.I) for p in WORK_LOG)]


def test_findings_read_as_findings():
    text = FINDINGS.read_text()
    assert not (FINDINGS.parent / "notes.md").exists()
    assert work_log_lines(text) == []
    assert len(text.splitlines()) <= 420


def test_the_scan_catches_a_diary_entry():
    diary = "# Findings\n\nDistilled from x.\n\n## Topic\n\nIn session 31 (commit 0dab94a) it read 1.5x.\n"
    assert len(work_log_lines(diary)) == 1


def test_the_chapters_teach_without_history():
    """The chapters' prose names no session, lent machine, date or commit: history lives in git."""
    import json
    chapters = sorted((FINDINGS.parent.parent / "instructor").glob("*.ipynb"))
    found = []
    for path in chapters:
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "markdown":
                found += [f"{path.name}: {line}" for line in source.splitlines()
                          if any(re.search(p, line, re.I) for p in [*WORK_LOG, r"\blent\b", r"\bsession\b"])]
    assert chapters and found == []
