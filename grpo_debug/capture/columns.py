"""The dataset's columns as TRL passes them to the reward functions (its `reward_kwargs`): every key of a batch row
but the prompt and the completion, one value per completion. A capture keeps them, so that a reward function that
reads a column (`def correct(prompts, completions, answer, **kwargs)`, TRL's documented pattern) is recomputed as
the trainer called it: replay, the doctor, its probes and every new completion of a captured prompt."""

from __future__ import annotations

import json

from ..task import callable_name

NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # what TRL leaves out of reward_kwargs
MAX_COLUMN_BYTES = 2**20  # one column's JSON over the batch: a column past it is not kept, and said so


def batch_columns(rows: list[dict], gather=lambda values: values) -> tuple[dict[str, list], dict[str, str]]:
    """({column: [value per row]}, {column: why it was not kept}) of a generation batch's rows (`inputs`, TRL's list
    of dataset rows, one per completion), each column's values gathered over processes by `gather`. A value JSON
    cannot hold as it is (a tensor, an array, an object) is not turned into something else: its column is left out,
    with the reason, so that no reward is recomputed from a value the run never had."""
    keys = [k for k in (rows[0] if rows else {}) if k not in NOT_COLUMNS]
    kept, dropped = {}, {}
    for key in keys:
        values = gather([row.get(key) for row in rows])
        try:
            text = json.dumps(values, allow_nan=False)
        except (TypeError, ValueError) as e:
            dropped[key] = f"not JSON as it is ({str(e)[:80]})"
            continue
        if len(text) > MAX_COLUMN_BYTES:
            dropped[key] = f"{len(text)} bytes of JSON, over {MAX_COLUMN_BYTES}"
            continue
        if json.loads(text) != values:  # a tuple turned list, an int-keyed dict turned str-keyed: not as it was
            dropped[key] = "not JSON as it is (a value reads back changed)"
            continue
        kept[key] = values
    return kept, dropped


def check_columns(meta: dict, rows: int) -> str | None:
    """Why capture.json's `columns` / `columns_dropped` are malformed, or None (a capture written before them has
    neither)."""
    columns, dropped = meta.get("columns", {}), meta.get("columns_dropped", {})
    if not isinstance(columns, dict) or not isinstance(dropped, dict):
        return "columns and columns_dropped must be JSON objects"
    for name, values in columns.items():
        if name in NOT_COLUMNS or not isinstance(values, list) or len(values) != rows:
            return f"column {name!r} is not a list of {rows} values, one per completion"
    if not all(isinstance(v, str) for v in dropped.values()):
        return "columns_dropped holds a reason that is not a string"
    return None


def columns_by_prompt(columns: dict[str, list], prompt_texts: list[list[str]], G: int) -> dict[str, dict]:
    """{prompt text: {column: value}}: each captured prompt (as every text in `prompt_texts[i]` it is shown or
    sampled as) with its row's columns (TRL repeats a dataset row for each of its G completions; the first
    completion's row is read)."""
    out = {}
    for i, texts in enumerate(prompt_texts):
        values = {name: column[i * G] for name, column in columns.items()}
        for text in texts:
            out.setdefault(text, values)
    return out


def with_columns(func, by_prompt: dict[str, dict], names: list[str]):
    """`func` called as TRL calls it: the batch's dataset columns as keywords, one value per completion, looked up
    by each completion's prompt. A prompt the capture does not hold is refused in one line."""

    def reward(prompts, completions, **kwargs):
        missing = next((p for p in prompts if p not in by_prompt), None)
        if missing is not None:
            raise ValueError(
                f"reward function {callable_name(func)!r} reads the dataset columns {names}, and the "
                f"capture holds none for the prompt {str(missing)[:60]!r}"
            )
        columns = {name: [by_prompt[p][name] for p in prompts] for name in names}
        return func(prompts=prompts, completions=completions, **columns, **kwargs)

    reward.__name__, reward.__wrapped__ = callable_name(func), func
    return reward


def dataset_columns(trainer, inputs, n: int) -> tuple[dict[str, list], dict[str, str]]:
    """`columns.batch_columns` of the generation batch's dataset rows, gathered over processes in process order (as
    the batch's tensors are); nothing where the rows are not one per completion of the n gathered."""
    from accelerate.utils import gather_object

    rows = inputs if isinstance(inputs, list) and all(isinstance(r, dict) for r in inputs) else []
    processes = trainer.accelerator.num_processes
    columns, dropped = batch_columns(rows, gather_object if processes > 1 else lambda values: values)
    if len(rows) * processes != n:
        return {}, {k: "the batch's rows are not one per completion" for k in (*columns, *dropped)}
    return columns, dropped


def trainer_keywords(step: int, max_steps: int | None) -> dict:
    """What TRL 1.16 passes every reward function beside the prompts, the completions and the columns
    (`_calculate_rewards`'s reward_kwargs): `trainer_state`, its TrainerState at the step's generation
    (`global_step` the optimizer steps done before it: a schedule that reads it scores as in the run), and
    `log_extra`, `log_metric`, which log nothing here. TRL's `completion_ids` is not given (a function that needs
    it is refused in one line), nor `environments`. The state is built at its first attribute read
    (`LazyTrainerState`): importing transformers' trainer takes seconds a function that never reads it should not pay."""
    from ..reward_process import LazyTrainerState

    state = LazyTrainerState({"global_step": max(step - 1, 0), "max_steps": max_steps or 0})
    return {"trainer_state": state, "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}


def with_trainer_keywords(func, keywords: dict):
    """`func` called with TRL's other keywords (`trainer_keywords`) as well, as TRL calls it."""

    def reward(prompts, completions, **kwargs):
        return func(prompts=prompts, completions=completions, **{**keywords, **kwargs})

    reward.__name__, reward.__wrapped__ = callable_name(func), func
    return reward
