import chess
import pytest

from grpo_debug.chess.data import env_example, load_split, policy_example
from grpo_debug.chess.tokenizer import train_tokenizer

LINES = [
    p + c
    for p, c in [policy_example(r) for r in load_split("policy_eval")[:300]]
    + [env_example(r) for r in load_split("env_eval")[:300]]
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(LINES, vocab_size=300)


def test_decode_inverts_encode(tokenizer):
    for line in LINES:
        ids = tokenizer(line, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == line


def test_every_board_square_is_one_token(tokenizer):
    board = chess.Board("8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31")
    tokens = tokenizer.tokenize(f"P: {board.fen()} ")
    board_tokens = tokens[tokens.index("P: ") + 1 :][:71]
    assert len(board_tokens) == 71 and all(len(t) == 1 for t in board_tokens)
    assert "".join(board_tokens) == "________/__k__b__/R_p____r/___p_p__/P_______/__P__B_P/_____PPK/____R___"


def test_prompt_tokenizes_the_same_alone_as_in_its_line(tokenizer):
    for prompt, completion in [policy_example(r) for r in load_split("policy_eval")[:100]] + [
        env_example(r) for r in load_split("env_eval")[:100]
    ]:
        alone = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]
        assert full[: len(alone)] == alone


def test_digits_outside_the_board_are_untouched(tokenizer):
    text = "P: 8/8/8/8/8/8/8/K6k w - - 12 48 M: a1a2 E: -1.28 B: a1b2"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert "a1" in tokenizer.tokenize(text) and "________" not in tokenizer.tokenize(text)


def test_pad_is_not_eos(tokenizer):
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.model_input_names == ["input_ids", "attention_mask"]
