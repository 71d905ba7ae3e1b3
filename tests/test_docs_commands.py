"""Every command the documentation shows (README.md and docs/, in its fenced shell blocks) is one the project
has: each `python -m grpo_debug ...` line is read by the command line's own parser (a flag renamed or a value
no longer allowed fails here, before a reader meets it), each `make TARGET` names a target of the Makefile, and
each `python benchmarks/SCRIPT.py` or `bash PATH` names a file that is there."""

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shell_lines() -> list[tuple[str, str]]:
    """(page, command) for each line of each fenced bash block, its comment cut off."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.splitlines():
                command = line.split("  #")[0].split(" # ")[0].strip()
                if command and not command.startswith("#"):
                    out.append((page.name, command))
    return out


LINES = shell_lines()


def test_the_pages_show_commands():
    assert sum("grpo_debug" in c for _, c in LINES) >= 10, LINES


@pytest.mark.parametrize("page, command", [(p, c) for p, c in LINES if " -m grpo_debug " in f"{c} "])
def test_each_grpo_debug_command_is_read_by_its_parser(page, command):
    from grpo_debug.cli.commands import command_line

    argv = shlex.split(command)
    argv = argv[argv.index("grpo_debug") + 1 :]
    try:
        command_line().parse_args(argv)
    except SystemExit as e:
        if e.code == 0:  # --help: read, and answered
            return
        pytest.fail(f"{page}: `{command}` is not read by python -m grpo_debug's parser (exit {e.code})")


@pytest.mark.parametrize("page, command", [(p, c) for p, c in LINES if c.startswith("make ")])
def test_each_make_command_names_a_target(page, command):
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for word in shlex.split(command)[1:]:
        if "=" not in word and not word.startswith("-"):
            assert word in targets, f"{page}: `{command}` names no Makefile target {word!r}"


@pytest.mark.parametrize("page, command", [(p, c) for p, c in LINES if re.match(r"(python|bash) [\w/]+\.(py|sh)", c)])
def test_each_script_command_names_a_file_that_is_there(page, command):
    script = shlex.split(command)[1]
    assert (ROOT / script).is_file(), f"{page}: `{command}` names {script}, which is not there"
