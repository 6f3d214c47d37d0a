"""The console (live display on a terminal, plain lines in CI / pipes) and the metric sinks."""

import io
import json
import re

import pytest
from _runs import healthy_run

from rlvr.observe.console import RunLogger
from rlvr.observe.sinks import CompletionsTable, make_sinks

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _metrics(step, **extra):
    m = {
        "step": step,
        "reward": 0.5,
        "reward_std": 0.25,
        "rewards/correct/mean": 0.5,
        "rewards/format/mean": 0.75,
        "kl": 0.0123,
        "clip_ratio/region_mean": 0.01,
        "completions/mean_length": 12.5,
        "completions/max_length": 20.0,
        "completions/clipped_ratio": 0.1,
        "entropy": 0.8,
        "frac_reward_zero_std": 0.25,
        "loss": 0.01,
        "time/step": 0.5,
        "grad_norm": 1.0,
    }
    m.update(extra)
    return m


def test_cli_under_a_pipe_prints_one_plain_line_per_step(tmp_path_factory, tiny_model_dir, rlvr_cli):
    run, stdout = healthy_run(tmp_path_factory, tiny_model_dir, rlvr_cli)
    assert not ANSI.search(stdout), "no terminal escape codes when stdout is a pipe"
    assert "━" not in stdout and "\r" not in stdout  # no progress bar
    steps = [int(m.group(1)) for m in re.finditer(r"^step (\d+)/30 ", stdout, re.M)]
    assert steps == list(range(1, 31))
    line = next(x for x in stdout.splitlines() if x.startswith("step 30/30"))
    for field in ("reward ", "digit_share ", "clip ", "len ", "entropy ", "zero-std ", "s/step", "steps/s", "ETA "):
        assert field in line, (field, line)
    assert "[note] no KL penalty" in stdout


def test_live_display_shows_the_run_at_a_glance(tmp_path, monkeypatch):
    log = RunLogger(tmp_path, total_steps=10, live=True, config={"report_to": [], "doctor_every": 0})
    buf = io.StringIO()
    log.console.file = buf  # what a terminal would receive
    log.log(_metrics(1))
    log.log(_metrics(2))  # each step refreshes the display
    log.close()
    screen = ANSI.sub("", buf.getvalue())
    for text in (
        "step",
        "2/10",
        "ETA",
        "steps/s",
        "reward",
        "0.500±0.250",
        "correct",
        "format",
        "0.750",
        "kl",
        "0.0123",
        "clip",
        "len",
        "12.5/20",
        "entropy",
        "zero-std",
        "25%",
    ):
        assert text in screen, (text, screen[-1500:])


def test_plain_lines_when_not_a_terminal(tmp_path, capsys):
    log = RunLogger(tmp_path, total_steps=4, config={"report_to": [], "doctor_every": 0})
    assert not log.is_live  # pytest captures stdout: not a terminal
    log.log(_metrics(1))
    log.close()
    out = capsys.readouterr().out
    assert out.startswith("step 1/4  reward 0.500±0.250  correct 0.500  format 0.750  kl 0.0123  clip 0.010")
    assert "2.00 steps/s" in out and "ETA 0:00:02" in out


class _Notebook:
    """What rich draws a notebook's output with: IPython.display.display and an ipywidgets.Output to redraw in
    (neither is installed here); `shown` is what the cell shows now."""

    def __init__(self, monkeypatch, widgets: bool = True):
        import importlib.machinery
        import sys
        import types

        self.shown: list = []
        self.clear_on_next = False
        ipython, display = types.ModuleType("IPython"), types.ModuleType("IPython.display")
        display.display = self._display  # type: ignore[attr-defined]
        ipython.display = display  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "IPython", ipython)
        monkeypatch.setitem(sys.modules, "IPython.display", display)
        widgets_module = None
        if widgets:
            widgets_module = types.ModuleType("ipywidgets")
            widgets_module.__spec__ = importlib.machinery.ModuleSpec("ipywidgets", None)
            widgets_module.Output = self._output  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "ipywidgets", widgets_module)
        monkeypatch.delenv("CI", raising=False)

    def _display(self, obj) -> None:
        if self.clear_on_next:  # clear_output(wait=True): the old output goes when the new one comes, never blank
            self.shown.clear()
            self.clear_on_next = False
        self.shown.append(obj)

    def _output(self):
        notebook = self

        class Output:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def clear_output(self, wait=False):
                notebook.clear_on_next = True

        return Output()

    def text(self) -> str:
        return "\n".join(getattr(x, "text", "") for x in self.shown)


def test_a_notebook_shows_the_live_display(tmp_path, monkeypatch):
    from rich.console import Console

    notebook = _Notebook(monkeypatch)
    log = RunLogger(tmp_path, total_steps=3, config={"report_to": [], "doctor_every": 0}, console=Console(force_jupyter=True))
    assert log.is_live
    log.log(_metrics(1))
    log.log(_metrics(2))
    shown = notebook.text()  # redrawn in place: the latest step only
    assert "2/3" in shown and "1/3" not in shown and "0.500±0.250" in shown and "ETA" in shown, shown
    log.close()


def test_a_notebook_without_ipywidgets_gets_plain_lines(tmp_path, monkeypatch, capsys):
    from rich.console import Console

    _Notebook(monkeypatch, widgets=False)
    log = RunLogger(tmp_path, total_steps=2, config={"report_to": [], "doctor_every": 0}, console=Console(force_jupyter=True))
    assert not log.is_live  # rich would draw nothing without them
    log.log(_metrics(1))
    log.log(_metrics(2))
    log.close()
    out = capsys.readouterr().out
    assert [x.split("  ")[0] for x in out.splitlines()] == ["step 1/2", "step 2/2"] and not ANSI.search(out)


def test_doctor_warns_during_training(tmp_path, capsys):
    log = RunLogger(tmp_path, total_steps=20, config={"report_to": [], "doctor_every": 5})
    for s in range(1, 11):  # as the training loop does: log the step, then ask the doctor
        log.log(_metrics(s, frac_reward_zero_std=1.0, reward=0.0))
        log.run_doctor_when_due(s)
    log.close()
    out = capsys.readouterr().out
    assert out.count("[warning] doctor: every group had identical rewards") == 1  # once, after step 3
    assert "fix: " in out and "algo.dynamic_sampling=true" in out
    assert "details: rlvr doctor" in out


def test_metrics_jsonl_keeps_non_finite_values_readable(tmp_path):
    from rlvr.observe.run_files import read_metrics

    log = RunLogger(tmp_path, total_steps=2, config={"report_to": [], "doctor_every": 0})
    log.log(_metrics(1, loss=float("nan"), grad_norm=float("inf")))
    log.close()
    raw = (tmp_path / "metrics.jsonl").read_text()
    json.loads(raw)  # strict JSON, no bare NaN
    (m,) = read_metrics(tmp_path)
    assert m["loss"] is None and m["grad_norm"] == "inf"


def test_completions_table_jsonl_and_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    t = CompletionsTable(tmp_path)
    rows = [
        {"step": 10, "prompt": [{"role": "user", "content": "1+2="}], "completion": "3", "reward/correct": 1.0, "advantage": 0.9},
        {"step": 10, "prompt": [{"role": "user", "content": "1+2="}], "completion": "4", "reward/correct": None, "advantage": -0.9},
    ]
    t.samples(rows)
    t.samples([{**rows[0], "step": 20}])
    t.close()
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 3
    table = pq.read_table(tmp_path / "samples.parquet").to_pylist()
    assert [r["step"] for r in table] == [10, 10, 20]
    assert table[1]["reward/correct"] is None and table[0]["advantage"] == 0.9
    assert json.loads(table[0]["prompt"])[0]["content"] == "1+2="
    # a resumed run appends to the same table
    t2 = CompletionsTable(tmp_path)
    t2.samples([{**rows[1], "step": 30}])
    t2.close()
    assert [r["step"] for r in pq.read_table(tmp_path / "samples.parquet").to_pylist()] == [10, 10, 20, 30]


def test_a_logged_column_of_mixed_shapes_is_kept_as_json_text(tmp_path):
    """An agent's calls (chat messages in one episode, completion text in another) still make a readable table."""
    pq = pytest.importorskip("pyarrow.parquet")
    t = CompletionsTable(tmp_path)
    chat = [{"call": 0, "sent": [{"role": "user", "content": "hi"}], "reply": {"role": "assistant", "content": "yo"}}]
    text = [{"call": 0, "sent": "2+2=", "reply": "4"}]
    t.samples([{"step": 1, "agent_calls": chat, "advantage": 1.0}, {"step": 1, "agent_calls": text, "advantage": -1.0}])
    t.close()
    table = pq.read_table(tmp_path / "samples.parquet").to_pylist()
    assert [json.loads(r["agent_calls"]) for r in table] == [chat, text] and table[1]["advantage"] == -1.0


def test_tensorboard_sink_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = RunLogger(tmp_path, total_steps=3, config={"report_to": ["tensorboard"], "doctor_every": 0})
    for s in (1, 2, 3):
        log.log(_metrics(s, reward=0.1 * s))
    log.samples([{"step": 3, "prompt": "1+2=", "completion": "3", "reward/correct": 1.0, "advantage": 0.5}])
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [round(e.value, 3) for e in acc.Scalars("reward")] == [0.1, 0.2, 0.3]
    assert "rewards/format/mean" in acc.Tags()["scalars"]


def test_missing_or_failing_dashboards_never_stop_the_run(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("wandb", "trackio") else real(name, *a))
    sinks, notes = make_sinks(tmp_path, ["wandb", "trackio"])
    assert len(sinks) == 2 and any("wandb package is not installed" in n for n in notes)

    class Broken:
        def log(self, m):
            raise RuntimeError("dashboard down")

        def samples(self, rows):
            pass

        def close(self):
            pass

    log = RunLogger(tmp_path / "r", total_steps=2, config={"report_to": [], "doctor_every": 0})
    log.sinks.append(Broken())
    log.log(_metrics(1))
    log.log(_metrics(2))
    log.close()
    out = capsys.readouterr().out
    assert out.count("Broken failed (RuntimeError: dashboard down)") == 1
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 2
