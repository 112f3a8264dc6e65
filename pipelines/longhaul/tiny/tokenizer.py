"""A byte-level BPE tokenizer for the tiny local models, trained on airline text with Qwen's pre-tokenizer.

transformers 5 rebuilds the pre-tokenizer of every `qwen2` tokenizer from Qwen's split regex, so the BPE must be
trained behind exactly that pre-tokenizer; otherwise transformers (trainer side) and vLLM (server side) would
tokenize the same text differently. Training is deterministic for a given corpus and vocabulary size.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

#: Qwen2's pre-tokenizer split pattern (the one transformers' Qwen2Tokenizer installs).
QWEN_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501 - a string literal kept whole

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Control tokens: never produced by the BPE, skipped when decoding with skip_special_tokens.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
#: Hermes markup: single tokens, but not "special" so decoded text keeps them (vLLM's hermes parser reads them).
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
#: Qwen3's reasoning markup: single tokens, not "special" (decoded text keeps them, as Qwen3's tokenizer does).
THINK_TOKENS = ("<think>", "</think>")

DEFAULT_VOCAB_SIZE = 4096


def load_chat_template() -> str:
    """The Qwen2.5-style chat template with Hermes tool calls shipped with longhaul."""
    return resources.files("longhaul.tiny").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def build_bpe_tokenizer(
    corpus: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, markup: tuple[str, ...] = MARKUP_TOKENS
) -> Tokenizer:
    """Train a byte-level BPE on `corpus` behind Qwen's pre-tokenizer; special and markup tokens get fixed ids
    0..6 in the order ENDOFTEXT, IM_START, IM_END, <tool_call>, </tool_call>, <tool_response>, </tool_response>
    (then any further `markup`, e.g. THINK_TOKENS)."""
    tok = Tokenizer(
        BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[*SPECIAL_TOKENS, *markup],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in markup])
    return tok


def build_hf_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    markup: tuple[str, ...] = MARKUP_TOKENS,
    chat_template: str | None = None,
):
    """The trained BPE wrapped as a transformers `Qwen2Tokenizer` with a chat template attached (default:
    longhaul's Qwen2.5-style one)."""
    # deferred: transformers (~1 s)
    from transformers import PreTrainedTokenizerFast

    bpe = build_bpe_tokenizer(corpus, vocab_size, markup)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = load_chat_template() if chat_template is None else chat_template
    return hf
