"""Which committed result files are read together, and which held-out claims form one family.

`data/experiments/comparisons.json` defines each comparison once: its files (merged by
`results.merge_results`, which checks that they share their base config, K, seeds and evaluation), the arms
it borrows from another comparison as references, and its claims. `python -m grpo_debug analyze FILE` reads the
comparison FILE belongs to and `--write` stores in each file its share of that comparison's summary, and the
notebooks open comparisons by name: a claim gets one verdict, in one family, wherever it is printed.
"""

from __future__ import annotations

import json
from pathlib import Path

from .results import merge_results, reanalyze, select_arms, summarize

COMPARISONS_FILE = "comparisons.json"


def read_comparisons(folder: Path) -> dict[str, dict]:
    """The comparisons of a results folder (empty where it has no comparisons.json), checked: every file named
    exists, belongs to one comparison only, and every claim is (text, arm, other)."""
    path = Path(folder) / COMPARISONS_FILE
    if not path.exists():
        return {}
    try:
        comparisons = json.loads(path.read_text())["comparisons"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a comparisons file ({e})") from None
    owner: dict[str, str] = {}
    for name, spec in comparisons.items():
        for file in spec.get("files", []):
            if file in owner:
                raise ValueError(f"{path}: {file} is in both {owner[file]!r} and {name!r}: a claim needs one family")
            if not (Path(folder) / file).exists():
                raise ValueError(f"{path}: comparison {name!r} names {file}, which is not in {folder}")
            owner[file] = name
        if not spec.get("files") or any(len(c) != 3 for c in spec.get("claims", [])):
            raise ValueError(f"{path}: comparison {name!r} needs files, and claims as [text, arm, other]")
    return comparisons


def comparison_of(path: Path) -> str | None:
    """The name of the comparison that holds the results file `path`, or None."""
    path = Path(path)
    return next((n for n, s in read_comparisons(path.parent).items() if path.name in s["files"]), None)


def open_comparison(folder: Path, name: str) -> dict:
    """A comparison's files as one result (`merge_results`), its borrowed arms first, summarised with its
    claims; "comparison" and "question" say which it is."""
    folder = Path(folder)
    spec = read_comparisons(folder).get(name)
    if spec is None:
        raise ValueError(f"no comparison {name!r} in {folder / COMPARISONS_FILE}")
    load = lambda file: json.loads((folder / file).read_text())
    parts = [load(file) for file in spec["files"]]
    borrow = spec.get("borrow")
    if borrow:
        parts.insert(0, select_arms(load(borrow["file"]), borrow["arms"]))
    merged = parts[0]
    for part in parts[1:]:
        merged = merge_results(merged, part)
    claims = [tuple(c) for c in spec["claims"]] if "claims" in spec else None
    borrowed = tuple(borrow["arms"]) if borrow else ()
    summary = summarize(merged["records"], list(merged["arms"]), merged["seeds"], merged["steps"], claims, borrowed)
    return {
        **merged,
        "comparison": name,
        "question": spec.get("question", ""),
        "files": spec["files"],
        "summary": summary,
    }


def share_of(results: dict, comparison: dict) -> dict:
    """One file's results with its share of its comparison's summary: the rows of the arms it ran."""
    rows = {arm: comparison["summary"][arm] for arm in results["arms"] if arm in comparison["summary"]}
    return {**results, "comparison": comparison["comparison"], "summary": rows}


def analyze(path: str) -> tuple[dict, dict[str, dict]]:
    """`analyze FILE`: (the results to print, {file: what --write stores in it}). A file of a comparison is
    read with the comparison's other files and each of them gets its share; a file of no comparison (a run of
    your own) is summarised alone."""
    path = Path(path)
    name = comparison_of(path)
    if name is None:
        results = {k: v for k, v in reanalyze(json.loads(path.read_text())).items() if k != "comparison"}
        return results, {str(path): results}
    results = open_comparison(path.parent, name)
    files = [path.parent / f for f in results["files"]]
    return results, {str(f): share_of(json.loads(f.read_text()), results) for f in files}
