"""The package's shape: no import circle (a TYPE_CHECKING import counts: a reader follows it too), the core
never imports TracIn or the UI, the reference step loads no fast path, short functions, and the bug reports
named by what they claim (never "seed 00N", which a reader takes for a random seed)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "grpo_debug"
CORE_EXCLUDED = (
    "grpo_debug.tracin",
    "grpo_debug.ui",
    "grpo_debug.runs.train",
    "grpo_debug.runs.arms",
    "grpo_debug.__main__",
    "grpo_debug.ui.notebook",
    "grpo_debug.cli.commands",  # front ends, as __main__ is: the command line's parser and its commands
    "grpo_debug.cli.step_commands",  # (they write the token page)
    "grpo_debug.cli.doctor_commands",  # (they draw the doctor's page with the UI's figures)
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path, known: set[str], type_checking: bool = True) -> set[str]:
    """The package modules `path` imports; with `type_checking=False`, only those it imports at run time (an
    `if TYPE_CHECKING:` block is not run)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if not type_checking and isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known]
            # `from . import module` reads that module, not the package's __init__ (which `from .module import`
            # runs just as much)
            candidates = submodules if submodules and not node.module else [target, *submodules]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        out |= {c for c in candidates if c in known and c != name}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imported(name, path, set(mods)) for name, path in mods.items()}


def test_no_import_circle():
    edges = graph()
    state: dict[str, str] = {}
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not circles, circles


def test_the_core_never_imports_tracin_or_the_ui():
    edges = graph()
    core = [m for m in edges if m != "grpo_debug" and not m.startswith(CORE_EXCLUDED)]
    assert "grpo_debug.step" in core and "grpo_debug.update" in core
    reaching = {m: sorted(t for t in edges[m] if t.startswith(("grpo_debug.tracin", "grpo_debug.ui"))) for m in core}
    assert not {m: t for m, t in reaching.items() if t}


MAX_FUNCTION_LINES = 60  # a function a reader sees on one screen; a file is as long as its idea


def test_no_function_over_60_lines():
    too_long = {
        f"{module_name(p)}:{node.name}": n
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


MAX_CAPTURE_FILE_LINES = 500  # the capture wing, a room per idea: recorded, written, read back, checked


def test_no_file_of_the_capture_wing_over_500_lines():
    too_long = {
        p.name: n
        for p in (PACKAGE / "capture").glob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_CAPTURE_FILE_LINES
    }
    assert not too_long, f"grpo_debug/capture files over {MAX_CAPTURE_FILE_LINES} lines: {too_long}"


def test_the_bug_reports_are_named_by_their_claims_not_as_seeds():
    pattern = re.compile(r"\bseeds? 00\d|\bseed-00\d", re.IGNORECASE)
    places = [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "notebooks").glob("*.py"),
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("data/**/*.md"),
    ]
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in places
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_the_readable_phase_modules_never_import_the_fast_paths():
    """Speed is decided in one place (`speed.kernels`): the code a reader follows is the readable code only."""
    edges = graph()
    readable = ["rollout", "scoring", "logprobs", "rewards", "advantages", "loss", "update", "reference_step"]
    reaching = {m: sorted(t for t in edges[f"grpo_debug.{m}"] if t.startswith("grpo_debug.fast")) for m in readable}
    assert not {m: t for m, t in reaching.items() if t}


def test_importing_the_reference_step_loads_no_fast_path():
    """Checked on what Python loaded, not on the direct imports: nothing below the reference step reaches
    `grpo_debug.fast` either (the fast twins are imported by `speed.kernels(True)` on first use)."""
    code = (
        "import sys, grpo_debug.reference_step; "
        "print(sorted(m for m in sys.modules if m.startswith(('grpo_debug.fast', 'grpo_debug.tracin', 'grpo_debug.ui'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"importing grpo_debug.reference_step loads {loaded}"
