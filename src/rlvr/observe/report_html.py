"""The report's HTML pieces: the runs table, reward failures, the doctor's findings, completion
tables (multi-turn episodes as their conversation), the figures with their embedded PNGs, and the
page's stylesheet. Every piece of text from a run is escaped."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

from rlvr.observe.doctor import Finding, num
from rlvr.observe.report_data import Run, held_out_label
from rlvr.observe.sinks import prompt_text


_SAMPLE_KEYS = {"step", "prompt", "completion", "conversation", "advantage", "_total"}  # _total: set by best_worst


def completion_table(rows: list[dict]) -> str:
    if not rows:
        return "<p class=dim>none logged</p>"
    reward_keys, logged_keys = [], []  # logged: the columns reward functions added (TRL's log_extra)
    for r in rows:
        reward_keys += [k for k in r if k.startswith("reward/") and k not in reward_keys]
        logged_keys += [k for k in r if not k.startswith("reward/") and k not in _SAMPLE_KEYS and k not in logged_keys]
    head = "".join(f"<th>{html.escape(k[7:])}</th>" for k in reward_keys) + "".join(f"<th>{html.escape(k)}</th>" for k in logged_keys)
    out = [f"<table><tr><th>step</th><th>prompt</th><th>completion</th><th>total</th>{head}<th>advantage</th></tr>"]
    for r in rows:
        cells = "".join(f"<td class=num>{_num(r.get(k))}</td>" for k in reward_keys)
        cells += "".join(f"<td>{html.escape(str(r.get(k, '')))}</td>" for k in logged_keys)
        out.append(
            f"<tr><td class=num>{r.get('step', '')}</td><td><pre>{html.escape(prompt_text(r.get('prompt', '')))}</pre></td>"
            f"<td>{_episode_html(r)}</td><td class=num>{_num(r.get('_total'))}</td>{cells}"
            f"<td class=num>{_num(r.get('advantage'), '+.3f')}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _episode_html(row: dict) -> str:
    """A completion; a multi-turn episode as its conversation, tool calls and results marked."""
    conv = row.get("conversation")
    if not isinstance(conv, list):
        return f"<pre>{html.escape(str(row.get('completion', '')))}</pre>"
    parts = []
    for m in conv:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", ""))
        text = str(m.get("content") or "")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            text += f"\n[tool call] {fn.get('name', '?')}({json.dumps(fn.get('arguments', {}), ensure_ascii=False)})"
        label = f"tool result ({m.get('name', '?')})" if role == "tool" else role
        cls = "tool" if role == "tool" else "turn"
        parts.append(f"<div class={cls}><span class=dim>{html.escape(label)}</span><pre>{html.escape(text)}</pre></div>")
    return "".join(parts)


def _num(v, spec: str = ".3f") -> str:
    x = num(v)
    return format(x, spec) if math.isfinite(x) else html.escape(str(v))


def runs_table(runs: list[Run]) -> str:
    def get(cfg, dotted, default="-"):
        node = cfg
        for p in dotted.split("."):
            if not isinstance(node, dict) or p not in node:
                return default
            node = node[p]
        return node

    out = [
        "<table><tr><th>run</th><th>steps</th><th>model</th><th>loss</th><th>G</th><th>lr</th><th>beta</th>"
        f"<th>first → last reward</th><th>held-out {held_out_label(runs)}</th><th>train time</th></tr>"
    ]
    for r in runs:
        _, rewards = r.series("reward")
        first = sum(rewards[:5]) / max(1, len(rewards[:5])) if rewards else math.nan
        last = sum(rewards[-5:]) / max(1, len(rewards[-5:])) if rewards else math.nan
        acc = "-"
        if "eval_before" in r.summary or "eval_after" in r.summary:
            b, a = r.summary.get("eval_before"), r.summary.get("eval_after")
            fmt = _pct if r.summary.get("eval_label", "accuracy") == "accuracy" else _num
            acc = f"{fmt(b)} → {fmt(a)}"
        t = r.summary.get("train_seconds")
        c = r.config
        out.append(
            f"<tr><td><b>{html.escape(r.name)}</b><br><span class=dim>{html.escape(str(r.dir))}</span></td>"
            f"<td class=num>{len(r.metrics)}</td><td>{html.escape(str(get(c, 'model.path')))}</td>"
            f"<td>{html.escape(str(get(c, 'algo.loss_type')))}</td><td class=num>{get(c, 'rollout.group_size')}</td>"
            f"<td class=num>{get(c, 'optim.lr')}</td><td class=num>{get(c, 'algo.beta')}</td>"
            f"<td class=num>{_num(first)} → {_num(last)}</td><td class=num>{acc}</td>"
            f"<td class=num>{'-' if t is None else f'{t:.0f}s'}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def reward_errors_table(runs: list[Run]) -> str:
    """Per run and reward function: failed samples in all, steps with failures, the worst step's failure rate."""
    rows = []
    for r in runs:
        for name in r.reward_names:
            steps, errors = r.series(f"rewards/{name}/errors")
            _, rates = r.series(f"rewards/{name}/error_rate")
            total = sum(e for e in errors if math.isfinite(e))
            if total:
                failing = sum(1 for e in errors if e > 0)
                rows.append(
                    f"<tr><td>{html.escape(r.name)}</td><td>{html.escape(name)}</td><td class=num>{total:.0f}</td>"
                    f"<td class=num>{failing} of {len(steps)}</td><td class=num>{_pct(max(rates) if rates else math.nan)}</td></tr>"
                )
    if not rows:
        return "<p class=ok>No reward function failed.</p>"
    return (
        "<table><tr><th>run</th><th>reward</th><th>failed samples</th><th>steps with failures</th><th>worst step</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _pct(v) -> str:
    return "-" if v is None or not math.isfinite(float(v)) else f"{float(v):.1%}"


def findings_html(findings: list[Finding]) -> str:
    if not findings:
        return "<p class=ok>No problems found.</p>"
    items = []
    for f in findings:
        items.append(
            f"<li class={f.severity}><b>{html.escape(f.rule)}</b> <code>{html.escape(f.metric)}</code>: {html.escape(f.message)}"
            f"<br><span class=dim>evidence:</span> {html.escape(f.evidence)}<br><span class=dim>fix:</span> {html.escape(f.fix)}</li>"
        )
    return "<ul>" + "".join(items) + "</ul>"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1320px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ddd;padding:.3em .5em;vertical-align:top;text-align:left}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:36em;font-size:.95em}
.dim{color:#777;font-size:.9em} .ok{color:#1a7f37} li.warning{color:#8a5a00} li.error{color:#b42318} li{margin-bottom:.6em}
.plots{display:flex;flex-wrap:wrap;gap:0 1.5em;align-items:flex-start}
figure{margin:1em 0;max-width:100%} figure h3{margin:.2em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
div.turn,div.tool{padding:.15em .4em;margin:.1em 0;border-left:3px solid #9bb7d4} div.tool{border-left-color:#d4a72c;background:#fffbeb}
"""


def _png_width(png: Path) -> int:
    """Pixel width from the PNG header (IHDR), so captions wrap at the image's width."""
    return int.from_bytes(png.read_bytes()[16:20], "big")


def figure_html(title: str, caption: str, png: Path) -> str:
    """A plot as a figure: its title, the PNG embedded as base64, its caption as wide as the image."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (
        f'<figure id="{png.stem}"><h3>{html.escape(title)}</h3><img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'
        f'<figcaption style="max-width:{_png_width(png)}px">{html.escape(caption)}</figcaption></figure>'
    )
