import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_debug import load_model
from grpo_debug.chess.data import load_split, policy_example
from grpo_debug.files import DEFAULT_MODEL_DIR
from grpo_debug.model import ModelUnavailable

CARD = DEFAULT_MODEL_DIR / "README.md"


def test_bundled_model_loads_offline_with_plain_transformers():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert model.config.resid_pdrop == model.config.attn_pdrop == model.config.embd_pdrop == 0.1
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id and model.config.pad_token_id == tokenizer.pad_token_id
    prompt, completion = policy_example(load_split("policy_prompts")[0])
    enc = tokenizer(prompt + completion, return_tensors="pt")
    assert list(enc) == ["input_ids", "attention_mask"] and enc["input_ids"].shape[1] <= model.config.n_positions


def test_bundled_model_is_small():
    size = sum(p.stat().st_size for p in DEFAULT_MODEL_DIR.iterdir() if p.name != "train_state.pt")
    assert size <= 25 * 2**20


def test_load_model_returns_a_frozen_reference_copy():
    policy, reference, tokenizer = load_model()
    assert not any(p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in policy.parameters())
    assert policy is not reference and not policy.training
    for a, b in zip(policy.parameters(), reference.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert tokenizer.padding_side == "left"


def test_an_unreachable_hub_id_fails_at_once_with_directions():
    start = time.time()
    with pytest.raises(ModelUnavailable, match="huggingface-cli download jrahn/RookWorld-LM-124M"):
        load_model("jrahn/RookWorld-LM-124M")
    assert time.time() - start < 30
    with pytest.raises(ModelUnavailable, match="no model folder"):
        load_model("./no/such/folder")


def test_model_card_states_the_floor_metrics():
    text = CARD.read_text()
    metrics = json.loads(text.split("```json")[1].split("```")[0])
    for key in [
        "policy/parse_rate",
        "policy/best_move_legal",
        "policy/best_move_top5",
        "groups_nonzero_std",
        "env/next_fen_exact",
    ]:
        assert key in metrics
    assert "python -m grpo_debug.chess.quality" in text
