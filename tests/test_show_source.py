"""A notebook shows the idea's lines of a function: a long signature on one line, the docstring's first line, at most
SHOWN_LINES lines, then where the rest is. What it shows still parses as Python where nothing was cut."""

import ast

from grpo_debug.scoring import token_logps
from grpo_debug.ui.notebook import SHOWN_LINES, idea_lines
from grpo_debug.update import update


def test_a_long_function_is_cut_to_its_ideas_lines_with_a_pointer_to_the_whole():
    lines = idea_lines(update)
    assert len(lines) == SHOWN_LINES + 1, f"{len(lines)} lines shown, not {SHOWN_LINES} and a pointer"
    assert lines[0].startswith("def update(model, batch, scoring, loss, optimization,"), lines[0]
    assert lines[-1].strip().startswith("# ...") and "grpo_debug/update.py" in lines[-1], lines[-1]
    assert sum('"""' in line for line in lines) == 1, "the docstring is not cut to one line"
    assert "optimizer.step()" in "\n".join(lines), "the update's own step was cut from what is shown"


def test_a_short_function_is_shown_whole_and_still_parses():
    lines = idea_lines(token_logps)
    assert len(lines) < SHOWN_LINES and not lines[-1].strip().startswith("# ..."), lines
    ast.parse("\n".join(lines))  # a SyntaxError here is a shown source that is not code
    assert any("gather" in line for line in lines), "the gather, the idea of token_logps, is not shown"
