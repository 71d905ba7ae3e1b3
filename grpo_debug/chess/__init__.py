"""Everything RookWorld, the bundled task: text formats and parsers (`format`), Stockfish (`engine`), the
bundled data (`data`), the tokenizer and training of the bundled model (`tokenizer`, `train_model`), its
quality floors and card (`quality`, `card`), the chess rewards (`rewards`) and the task itself (`task`:
prompt sets, the `rookworld` reward function). The engine imports none of it: the tasks 'policy', 'env'
and 'mixed' are registered in `grpo_debug.task` by import string."""
