"""A character-level tokenizer with a chat template, saved as a PreTrainedTokenizerFast.

Every printable ASCII character is one token, so any prompt can be encoded (datasets in tests,
user files), and digits are single tokens, which is what arithmetic needs.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHARS = sorted(set(string.printable) - set("\r\x0b\x0c\t"))

# One turn per message; an assistant turn ends with EOS, which is where generation stops.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    specials = [PAD, BOS, EOS, UNK, *ROLE_TOKENS]
    vocab = {tok: i for i, tok in enumerate(specials + CHARS)}
    # BPE without merges is a character model; byte-level pre-tokenisation is not wanted.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.add_special_tokens(specials)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=256,
    )
    return fast
