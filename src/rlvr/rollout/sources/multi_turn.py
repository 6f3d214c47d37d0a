"""The multi-turn rollout source: episodes in which the model calls tools or acts in an environment.

The model writes a turn; when the turn calls tools (rlvr.tools formats: the tag protocol
`<calc>12*34</calc>` -> `<result>408</result>`, its tools described in the system prompt, or the chat template's Hermes/Qwen
`<tool_call>{json}</tool_call>` with results as `role: tool` messages), its row waits while the
calls run concurrently (rlvr.tools.ToolRunner, each bounded by a timeout), then the results (and
the template's glue) are appended as external tokens (loss mask 0) and the model continues, up to
`max_turns` model turns or the token budget. The engine decodes the episodes (a MultiTurnEngine:
the hf engine continues each from its KV cache, rlvr.rollout.engines.hf.episode_decode) and asks
this source's TurnDriver between turns. Every failure a tool can have becomes a message the model sees and
is counted. With an environment (TRL's environment_factory contract) each episode gets its own
instance: `reset(**row)` may return text appended to the prompt, its public methods are tools,
`get_reward()` is an extra reward named after the class, and reward functions get the instances
as `environments` (one per completion, as TRL 1.16 passes them). An episode whose `reset` raises
is left out (no reward, no loss) and counted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from rlvr.data import prompt_messages, render_prompt
from rlvr.data.checks import check_prompt_lengths
from rlvr.models.precision import autocast_context
from rlvr.rollout.engines.protocols import GenerationEngine, MultiTurnEngine, SamplingParams
from rlvr.rollout.engines.turns import cut_after_stop
from rlvr.rollout.episodes import Episodes, pad_rows
from rlvr.tools import (
    EnvironmentFactory,
    HermesFormat,
    TagFormat,
    ToolRunner,
    ToolSet,
    check_prefix_preserving,
    choose_format,
    glue_after_turn,
)


@dataclass
class _Row:
    """One episode's state while it is decoded."""

    tools: dict = field(default_factory=dict)
    env: object | None = None
    valid: bool = True
    messages: list = field(default_factory=list)  # the conversation after the prompt (what rewards see)
    pending: list = field(default_factory=list)  # PendingCalls of the current turn
    turns: int = 0
    calls: int = 0
    failures: int = 0
    per_tool: dict = field(default_factory=dict)
    end_of_turn: str | None = None
    after_stop: str = ""  # text of the stopping token after the stop string (e.g. the `<` of SmolLM2's `><`)
    capped: bool = False  # stopped by max_turns with a call unanswered
    env_error: bool = False  # the environment's reset() or get_reward() raised


class MultiTurnSource:
    """RolloutSource: G episodes per row, each a conversation of model turns and tool results."""

    def __init__(
        self,
        engine: GenerationEngine,  # a MultiTurnEngine too (checked)
        tokenizer,
        sampling: SamplingParams,
        *,
        fmt,
        tools: ToolSet | None = None,
        environment: EnvironmentFactory | None = None,
        runner: ToolRunner | None = None,
        max_turns: int = 4,
        system_prompt: str | None = None,
        context_length: int | None = None,
        autocast: str = "none",
        device: torch.device | str = "cpu",
    ):
        if not isinstance(engine, MultiTurnEngine):
            raise ValueError(f"{type(engine).__name__} cannot run multi-turn episodes; use rollout.engine=hf")
        self.engine, self.tokenizer, self.sampling, self.fmt = engine, tokenizer, sampling, fmt
        self.tools, self.environment = tools, environment
        self.runner = runner or ToolRunner()
        self.max_turns, self.system_prompt, self.context_length = max_turns, system_prompt, context_length
        self.autocast, self.device = autocast, torch.device(device)
        self.schemas = (tools.schemas if tools else []) + (environment.schemas if environment else [])
        # the tags format shows the tools in the system prompt, from the schemas the chat template would get as tools=
        self.description = fmt.describe(self.schemas) if getattr(fmt, "describe_tools", False) else ""
        self.notes: list[str] = []  # what the run should print at start (how tools.format was chosen, ...)
        # what reward functions get besides the dataset's columns: TRL's `environments`, the episodes' instances
        self.reward_columns = frozenset({"environments"}) if environment is not None else frozenset()
        self.first_env_error: str | None = None  # the first reset()/get_reward() failure, `Type: message`

    @property
    def group_size(self) -> int:
        return self.sampling.n

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    # ------------------------------------------------------------------ one batch

    def rollout(self, rows: list[dict], seeds: list[int]) -> Episodes:
        G = self.group_size
        states = [self._start(row) for row in rows for _ in range(G)]
        prompts = [self._render(s.prompt) for s in states]
        self._check_lengths(prompts)
        driver = _Driver(self, states)
        self.runner.expect(len(states))  # each episode's calls run while the others decode, none queued behind another's
        grouped = all(prompts[i] == prompts[i - i % G] for i in range(len(prompts)))
        with autocast_context(self.autocast, self.device, getattr(self.engine, "model", None)):
            if grouped:  # the G episodes of a row share their prompt: prefilled once
                p_ids, p_mask, traces = self.engine.generate_episodes(prompts[::G], self.sampling, seeds, driver)
                p_ids, p_mask = p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0)
            else:  # an environment's reset text made them differ
                one = SamplingParams(**{**self.sampling.__dict__, "n": 1})
                p_ids, p_mask, traces = self.engine.generate_episodes(prompts, one, [s * G + j for s in seeds for j in range(G)], driver)
        for i, trace in enumerate(traces):  # the last turn: it called no tool, or was cut by the budget
            driver.close_turn(i, trace.turn)
        return self._episodes(rows, states, p_ids, p_mask, traces)

    def _start(self, row: dict) -> "_Start":
        st = _Start(row.get("prompt"), _Row())
        r = st.row
        if self.tools:
            r.tools = self.tools.for_episode()
        if self.environment is not None:
            try:
                r.env = self.environment.new()
                text = self.environment.reset(r.env, {k: v for k, v in row.items() if k != "prompt"})
                r.tools.update(self.environment.tools(r.env))
                st.prompt = _append_to_prompt(st.prompt, text)
            except Exception as e:  # the environment's own code failed: this episode is left out
                r.valid, r.env, r.tools, r.env_error = False, None, {}, True
                self._env_failed("reset()", e)
        if st.prompt is None:
            raise ValueError("a row has no `prompt` and its environment's reset() returned no text to use as one")
        return st

    def _render(self, prompt) -> str:
        if isinstance(self.fmt, HermesFormat):
            return self.tokenizer.apply_chat_template(
                prompt_messages(prompt, self.system_prompt), tools=self.schemas, add_generation_prompt=True, tokenize=False
            )
        if self.description:
            return render_prompt(_with_system_text(prompt_messages(prompt, self.system_prompt), self.description), self.tokenizer)
        return render_prompt(prompt, self.tokenizer, self.system_prompt)

    def _check_lengths(self, prompts: list[str]) -> None:
        try:
            check_prompt_lengths(prompts, self.tokenizer, self.context_length, self.sampling.max_new_tokens)
        except ValueError as e:
            if not self.description:
                raise
            n = len(self.tokenizer(self.description, add_special_tokens=False)["input_ids"])
            raise ValueError(
                f"{e}; {n} of its tokens are the tools' description in the system prompt: set tools.describe=false "
                "for a model trained on the tags without it, or use a model with a longer context"
            ) from None

    def _episodes(self, rows, states, p_ids, p_mask, traces) -> Episodes:
        G, pad = self.group_size, self.tokenizer.pad_token_id
        ids, attn = pad_rows([t.ids for t in traces], pad, min_width=1)
        loss, _ = pad_rows([t.loss for t in traces], 0, min_width=1)
        logp, _ = pad_rows([t.logps for t in traces], 0.0, min_width=1, dtype=torch.float32)
        valid = torch.tensor([s.row.valid for s in states])
        loss = loss * valid[:, None]  # an episode that failed to start is not trained
        extra = {}
        if self.environment is not None and self.environment.has_reward:
            extra[self.environment.name] = torch.tensor([self._env_reward(s.row) for s in states], dtype=torch.float32)
        info = {
            "env_errors": torch.tensor([float(s.row.env_error) for s in states]),
            "turns": torch.tensor([float(s.row.turns) for s in states]),
            "tool_calls": torch.tensor([float(s.row.calls) for s in states]),
            "tool_failures": torch.tensor([float(s.row.failures) for s in states]),
            "max_turns_reached": torch.tensor([float(s.row.capped) for s in states]),
            **{f"calls/{name}": torch.tensor([float(s.row.per_tool.get(name, 0)) for s in states]) for name in self._tool_names()},
        }
        texts = self.tokenizer.batch_decode(ids.masked_fill(attn == 0, pad), skip_special_tokens=True)
        columns = {"environments": [s.row.env for s in states]} if self.environment is not None else {}
        return Episodes(
            p_ids.cpu(),
            p_mask.cpu(),
            ids,
            attn,
            loss,
            logp,
            torch.tensor([t.truncated for t in traces]),
            torch.arange(len(rows)).repeat_interleave(G),
            G,
            [s.row.messages for s in states],
            texts,
            info=info,
            extra_rewards=extra,
            valid=valid,
            columns=columns,
            versions=None if any(t.version is None for t in traces) else torch.tensor([t.version for t in traces]),
        )

    def _tool_names(self) -> list[str]:
        return (self.tools.names if self.tools else []) + (self.environment.names if self.environment else [])

    def _env_reward(self, r: _Row) -> float:
        """get_reward() of the episode's environment; NaN (no reward) when it has none or it raised."""
        if r.env is None:
            return float("nan")
        assert self.environment is not None, "an episode has an env only when the source has an environment"
        try:
            value = self.environment.get_reward(r.env)
        except Exception as e:
            r.env_error = True
            self._env_failed("get_reward()", e)
            return float("nan")
        return float("nan") if value is None else value

    def _env_failed(self, where: str, error: Exception) -> None:
        assert self.environment is not None, "only an environment's calls fail here"
        if self.first_env_error is None:
            self.first_env_error = f"{self.environment.name}.{where}: {type(error).__name__}: {error}"

    # ------------------------------------------------------------------ metrics

    def metrics(self, episodes: Episodes) -> dict[str, float]:
        """TRL's tools/call_frequency (calls per episode) and tools/failure_frequency (failed / calls),
        calls per tool, turns per episode, the share of tokens that are external, reset failures."""
        info, n = episodes.info, max(len(episodes), 1)
        calls = float(info["tool_calls"].sum())
        attn, loss = episodes.attention_mask.float(), episodes.loss_mask.float()
        valid = torch.ones(len(episodes), dtype=torch.bool) if episodes.valid is None else episodes.valid
        m = {
            "tools/call_frequency": calls / n,
            "tools/failure_frequency": float(info["tool_failures"].sum()) / calls if calls else 0.0,
            "tools/max_turns_reached": float(info["max_turns_reached"].mean()),
            "episodes/turns": float(info["turns"].mean()),
            "episodes/external_token_share": float(((attn - loss) * valid[:, None]).sum() / (attn * valid[:, None]).sum().clamp(min=1)),
            "episodes/invalid": float((~valid).float().mean()),
            "episodes/environment_errors": float(info["env_errors"].sum()),
        }
        for key, v in info.items():
            if key.startswith("calls/"):
                m[f"tools/{key[len('calls/') :]}/call_frequency"] = float(v.sum()) / n
        return m


@dataclass
class _Start:
    prompt: object
    row: _Row


class _Driver:
    """rlvr.rollout.engines.turns.TurnDriver for one batch: parses turns, runs calls, hands back results."""

    def __init__(self, source: MultiTurnSource, states: list[_Start]):
        self.source, self.states, self.tok, self.fmt = source, states, source.tokenizer, source.fmt
        self.stop_strings = self.fmt.stop_strings
        self.turn_text: dict[int, str] = {}
        self.lock = threading.Lock()

    def end_turn(self, row: int, turn_ids: list[int], eos: bool) -> bool:
        s, fmt = self.states[row], self.fmt
        r = s.row
        r.turns += 1
        text = full = self.tok.decode(turn_ids, skip_special_tokens=True)
        if not eos:  # ended at a stop string, perhaps inside its last token
            text = cut_after_stop(full, self.stop_strings)
        r.after_stop = full[len(text) :]
        calls = fmt.parse(text) if r.valid else []
        if not calls:
            self.turn_text[row] = text
            return False
        if r.turns >= self.source.max_turns:  # no turn left to read the results in
            r.capped = True
            self.turn_text[row] = text
            return False
        r.messages.append(fmt.assistant_message(text, calls) if isinstance(fmt, HermesFormat) else {"role": "assistant", "content": text})
        r.end_of_turn = self.tok.decode(turn_ids[-1:]) if eos else None
        r.pending = [self.source.runner.submit(c, r.tools) for c in calls]
        r.calls += len(calls)
        for c in calls:
            r.per_tool[c.name] = r.per_tool.get(c.name, 0) + 1
        return True

    def ready(self, block: bool) -> dict[int, list[int] | None]:
        waiting = [i for i, s in enumerate(self.states) if s.row.pending]
        # A row resumes once all its calls are done; while blocked, wait for the next call to finish
        # until some row is whole (waking on any done call would spin while a row's slower call runs).
        while block and waiting and not any(all(p.done() for p in self.states[i].row.pending) for i in waiting):
            self.source.runner.wait_any([p for i in waiting for p in self.states[i].row.pending if not p.done()])
        out: dict[int, list[int] | None] = {}
        for i in waiting:
            r = self.states[i].row
            if all(p.done() for p in r.pending):
                results = [p.result() for p in r.pending]
                r.pending = []
                r.failures += sum(not x.ok for x in results)
                out[i] = self._external_ids(self.states[i], results)
        return out

    def _external_ids(self, s: _Start, results) -> list[int]:
        fmt, r = self.fmt, s.row
        if isinstance(fmt, TagFormat):
            r.messages += [{"role": "tool", "name": x.name, "content": x.text} for x in results]
            text = fmt.result_text(results)
            if r.after_stop and text.startswith(r.after_stop):  # the model already wrote the result tag's start
                text = text[len(r.after_stop) :]
        else:
            tool_msgs = fmt.result_messages(results)
            text = glue_after_turn(
                self.tok,
                prompt_messages(s.prompt, self.source.system_prompt) + r.messages,
                self.source.schemas,
                tool_msgs,
                end_of_turn=r.end_of_turn,
            )
            r.messages += tool_msgs
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def close_turn(self, row: int, unfinished: list[int]) -> None:
        """The episode's last model turn, once the decode is over (`unfinished`: ids of a turn the budget cut)."""
        text = self.turn_text.pop(row, None)
        if text is None and unfinished:
            text = self.tok.decode(unfinished, skip_special_tokens=True)
        if text is not None:
            self.states[row].row.messages.append({"role": "assistant", "content": text})


def _with_system_text(messages: list[dict], text: str) -> list[dict]:
    """The tools' description after the system prompt's own text (where Qwen-style templates put tools=), or as the system prompt."""
    if messages[0]["role"] == "system":
        own = messages[0]["content"]
        return [{**messages[0], "content": f"{own}\n\n{text}" if own else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _append_to_prompt(prompt, text: str | None):
    """An environment's reset text goes after the prompt (it is the prompt when the row has none)."""
    if not text:
        return prompt
    if prompt is None:
        return [{"role": "user", "content": text}]
    if isinstance(prompt, str):
        return f"{prompt}\n{text}" if prompt else text
    messages = [dict(m) for m in prompt]
    last = messages[-1]
    last["content"] = f"{last['content']}\n{text}" if last.get("content") else text
    return messages


def make_format(
    kind: str,
    tokenizer,
    *,
    tool_names: list[str],
    schemas: list[dict],
    tags: dict[str, str],
    result_tags: tuple[str, str],
    describe: bool = True,
    model: str = "the model",
):
    """The call format `tools.format` names (`auto`: rlvr.tools.chat_template.choose_format). `describe`: the
    tags format shows the tools in the system prompt. A template that cannot render tools, or rewrites earlier
    turns when a tool message is added, is refused for chat_template here."""
    kind, _ = choose_format(kind, tokenizer, model)
    if kind == "tags":
        return TagFormat({n: tags.get(n, n) for n in tool_names}, *result_tags, describe=describe)
    check_prefix_preserving(tokenizer, schemas)
    return HermesFormat()
