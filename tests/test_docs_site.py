"""The documentation a newcomer finds their way in (issue 73): README.md a front page of at most MAX_README_LINES
lines that links into docs/, and docs/ built as a site by MkDocs with every warning an error (a page left out of the
navigation, a link to a page or an anchor that is not there): what `make docs` runs."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_README_LINES = 250


def test_the_readme_is_a_front_page_that_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= MAX_README_LINES, f"README.md has {len(readme.splitlines())} lines"
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"](docs/{page.name})" in readme or page.name == "benchmarks.md", f"README links no docs/{page.name}"


def test_the_site_builds_with_no_warning(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warned, warned
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    pages = {"index.html"} | {f"{p.stem}/index.html" for p in (ROOT / "docs").glob("*.md") if p.stem != "index"}
    assert pages <= built, f"pages not built: {pages - built}"
