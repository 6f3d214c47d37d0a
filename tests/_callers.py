"""Real tiny models that call tools: a char-level Llama trained for a few seconds to write one
fixed episode (a tool call, then an answer after whatever the tool returned). Tests of the agent
path use them instead of a mocked model: everything downstream (decode, tools, update) is real."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from rlvr.models.build import char_llama_config

# A Hermes/Qwen-style tool template, short enough for a tiny model: tool names in a system turn,
# calls as <tool_call>{json}</tool_call>, results as <tool_response> in a user turn.
HERMES_MINI = (
    "{%- if tools %}{{- '<|im_start|>system\\ntools:' }}{%- for t in tools %}{{- ' ' + t.function.name }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    '{%- for c in (m.tool_calls or []) %}{{- \'<tool_call>{"name": "\' + c.function.name + \'", "arguments": \' }}'
    "{{- c.function.arguments | tojson }}{{- '}</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>' + m.content + '</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def hermes_tokenizer(template: str = HERMES_MINI):
    """Character-level, with Qwen's special tokens; <|im_end|> ends a turn (EOS)."""
    import string

    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(specials + chars)}, merges=[], unk_token="<unk>"))
    core.add_special_tokens(specials)
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=specials[:2],
        chat_template=template,
        padding_side="left",
    )


def train_caller(tokenizer, episodes: list[list[tuple[str, bool]]], *, steps: int = 300, seed: int = 0, max_positions: int = 256):
    """A tiny Llama that reproduces `episodes`: each a list of (text, trained) segments starting
    with the rendered prompt (not trained); external segments (tool results) are in context only."""
    torch.manual_seed(seed)
    cfg = char_llama_config(tokenizer, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, max_positions=max_positions)
    cfg.eos_token_id = tokenizer.eos_token_id
    model = LlamaForCausalLM(cfg)
    rows = []
    for segments in episodes:
        ids, labels = [], []
        for text, trained in segments:
            t = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += t
            labels += t if trained else [-100] * len(t)
        rows.append((ids, labels))
    n = max(len(i) for i, _ in rows)
    x = torch.full((len(rows), n), tokenizer.pad_token_id)
    y = torch.full((len(rows), n), -100)
    att = torch.zeros(len(rows), n, dtype=torch.long)
    for k, (i, lab) in enumerate(rows):
        x[k, : len(i)], y[k, : len(lab)], att[k, : len(i)] = torch.tensor(i), torch.tensor(lab), 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=x, attention_mask=att, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, float(loss.detach())
