"""A RookWorld tokenizer in which every board square is one token.

A FEN packs runs of empty squares into digits (`4P3`), so a small model has to count to find a
piece. The normalizer expands the board field, and only the board field, into one `_` per empty
square (`____P___`); the decoder packs the runs back, so `decode(encode(text)) == text`. Squares in
moves (`e2`, `e4`) are single tokens too, and the text is pre-split after spaces and `+`, so a
prompt tokenizes the same alone as inside a training line. Everything is expressed with the
`tokenizers` library's own components, so `AutoTokenizer.from_pretrained` loads the saved folder
with no custom code.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
PAD = "<pad>"
EMPTY = "_"
# A board character is followed, up to the next whitespace, by more board characters and then the
# side to move: that is how a digit inside the board is told apart from one in a move or a clock.
_BOARD_CONTEXT = r"(?=[1-8_pnbrqkPNBRQK/]*\s[wb]\s)"
_BOARD_CHAR = r"[_pnbrqkPNBRQK/]"


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence(
        [normalizers.Replace(Regex(f"{d}{_BOARD_CONTEXT}"), EMPTY * d) for d in range(8, 0, -1)]
    )


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_BOARD_CHAR + _BOARD_CONTEXT), behavior="isolated"),
            pre_tokenizers.Split(Regex("[a-h][1-8]"), behavior="isolated"),
            pre_tokenizers.Split(" ", behavior="merged_with_previous"),
            pre_tokenizers.Split("+", behavior="merged_with_previous"),
        ]
    )


def _decoder() -> decoders.Decoder:
    return decoders.Sequence([decoders.Fuse()] + [decoders.Replace(Regex(EMPTY * d), str(d)) for d in range(8, 0, -1)])


def train_tokenizer(lines: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.normalizer = _normalizer()
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = _decoder()
    alphabet = sorted(set("".join(lines[:20000])) | set("_pnbrqkPNBRQK/12345678abcdefgh0123456789 +-.:wEMBPA,"))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, PAD], initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return wrap(tokenizer)


def wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        model_input_names=["input_ids", "attention_mask"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
