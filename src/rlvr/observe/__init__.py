"""Watching a run: the console and metric sinks, the doctor that explains what is wrong, and the
HTML report.

    console.py       what a run shows while it trains (live display or one line per step)
    sinks.py         where metrics and completions go besides the console (metrics.jsonl, samples, TensorBoard, W&B, trackio)
    run_files.py     the one reader of a run folder's files
    doctor.py        the doctor: its rule table and findings
    signals.py       what the doctor's rules read beyond one metric's curve
    report.py        `rlvr report`: make_report assembles report.html from the three below
    report_data.py   the runs' data: metric series, unique names, best and worst completions
    report_plots.py  the PNGs (matplotlib), several runs overlaid
    report_html.py   the page's pieces: tables, findings, figures, stylesheet
"""
