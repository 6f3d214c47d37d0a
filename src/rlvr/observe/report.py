"""`rlvr report RUN_DIR [RUN_DIR2 ...]`: one self-contained `report.html` plus PNGs.

Plots (several runs overlaid, one colour per run): reward mean ± std and each reward function,
held-out accuracy (or a reward's mean) before/after and every eval.every steps, frac_reward_zero_std, clip ratios, KL (when a
penalty was on), entropy, completion length (mean, max, truncated share), learning rate and
gradient norm, and time per step split into generate / reward / train. Below them: the doctor's
findings and the best and worst completions of the last logged steps. Images are embedded as
base64, the page loads nothing from anywhere (no scripts, no fonts, no network).

Needs matplotlib: `pip install 'rlvr[report]'`.

This module assembles the page; the runs' data is shaped in report_data.py, the PNGs drawn in
report_plots.py and the page's pieces written in report_html.py.
"""

from __future__ import annotations

import html
from pathlib import Path

from rlvr.observe.doctor import Context, diagnose
from rlvr.observe.report_data import best_worst, load_run, unique_names
from rlvr.observe.report_html import CSS, completion_table, figure_html, findings_html, reward_errors_table, runs_table
from rlvr.observe.report_plots import draw_plots


def make_report(run_dirs: list[str | Path], out_dir: str | Path | None = None, *, title: str | None = None) -> Path:
    """Write report.html and the PNGs to out_dir (default: RUN_DIR/report for one run,
    ./rlvr-report for several); returns the path of report.html."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise ValueError("rlvr report: give at least one run folder")
    unique_names(runs)
    out = Path(out_dir) if out_dir else (runs[0].dir / "report" if len(runs) == 1 else Path("rlvr-report"))
    out.mkdir(parents=True, exist_ok=True)
    images = draw_plots(runs, out)

    title = title or ("rlvr report: " + ", ".join(r.name for r in runs))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Runs</h2>",
        runs_table(runs),
        "<h2>Reward errors</h2>",
        reward_errors_table(runs),
        "<h2>Doctor</h2>",
    ]
    for r in runs:
        findings = diagnose(r.metrics, Context(config=r.config))
        if len(runs) > 1:
            parts.append(f"<h3>{html.escape(r.name)}</h3>")
        parts.append(findings_html(findings))
    parts.append('<h2>Plots</h2><div class="plots">')
    parts += [figure_html(t, caption, png) for t, caption, png in images]
    parts.append("</div>")
    parts.append("<h2>Completions of the last logged steps</h2>")
    for r in runs:
        best, worst = best_worst(r)
        if len(runs) > 1:
            parts.append(f"<h3>{html.escape(r.name)}</h3>")
        parts.append("<h4>best</h4>" + completion_table(best))
        parts.append("<h4>worst</h4>" + completion_table(worst))
    parts.append("</body></html>")
    path = out / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
