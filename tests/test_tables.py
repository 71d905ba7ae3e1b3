"""The notebook tables' display convention (grpo_debug.ui.tables.FittedTable): long headers, index labels and text
wrap inside the column; the data keep their names and values. The widths in a real lab are tests/test_browser.py's."""

import pandas as pd

from grpo_debug.ui.tables import BREAK, FittedTable, breakable, fit_column


def test_break_opportunities_after_separators_only():
    assert breakable("rewards/best_move") == f"rewards/{BREAK}best_{BREAK}move"
    assert breakable("8/2k2b2 w - - 1 31+a6a5+") == f"8/{BREAK}2k2b2 w - - 1 31+{BREAK}a6a5+"  # none at the end
    assert breakable("M: e2e4 E: 0.3") == "M: e2e4 E: 0.3"


def test_the_display_wraps_and_the_data_stay_as_they_are():
    table = FittedTable(
        {"group": [0, 1], "completion": ["2kr3r/ppbbnp1q w", "M: e2e4"], "rewards/best_move": [1.0, float("nan")]}
    )
    shown = table[["completion", "rewards/best_move"]].head(1)
    assert isinstance(shown, FittedTable), "selecting keeps the display"
    html = shown._repr_html_()
    assert f"<th>rewards/{BREAK}best_{BREAK}move</th>" in html and f"2kr3r/{BREAK}ppbbnp1q w" in html
    assert list(shown.columns) == ["completion", "rewards/best_move"] and shown["completion"][0] == "2kr3r/ppbbnp1q w"
    assert BREAK not in repr(shown), "the plain-text display is pandas' own"
    index = pd.MultiIndex.from_tuples([("trl preset", "token_truncate")])
    html = fit_column(pd.DataFrame({"a/b": [1.5]}, index=index))._repr_html_()
    assert f"a/{BREAK}b" in html and "token_truncate" in html, "headers wrap, row names stay whole"


def test_a_trainer_trains_quietly_and_its_log_is_a_small_table():
    from transformers.trainer_callback import PrinterCallback

    from grpo_debug.ui.tables import trained_log

    class Trainer:  # the part of transformers' Trainer that trained_log uses
        def __init__(self):
            self.callbacks, self.state = [PrinterCallback], type("State", (), {"log_history": []})()

        def remove_callback(self, callback):
            self.callbacks = [c for c in self.callbacks if c is not callback]

        def train(self):
            assert not self.callbacks, "no printer left to print the dictionaries"
            self.state.log_history += [
                {"loss": 0.5, "grad_norm": 2.0, "epoch": 1.0, "step": 1},
                {"train_loss": 0.5, "train_runtime": 3.1, "step": 1},
            ]

    table = trained_log(Trainer(), ["loss", "grad_norm"])
    assert list(table.columns) == ["loss", "grad_norm"] and list(table.index) == [1] and table.index.name == "step"
