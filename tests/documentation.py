"""The documentation a sentence may live in: README.md, the front page, and the pages under docs/ it links to."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def documentation() -> str:
    """README.md and every docs/*.md, one after the other."""
    return "\n\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
