"""`rlvr report` on real runs: a self-contained report.html and PNGs that are real plots.

The browser test (`-m browser`, `make test-browser`; deselected by default) renders the page in
headless Chromium, screenshots it and checks the console is clean."""

import base64
import re
import shutil
import subprocess

import numpy as np
import pytest
from _runs import healthy_run, kl_run

pytest.importorskip("matplotlib")

EXPECTED = {"reward", "accuracy", "zero_std", "clip", "kl", "entropy", "length", "optim", "time"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, rlvr_cli):
    healthy, _ = healthy_run(tmp_path_factory, tiny_model_dir, rlvr_cli)
    return healthy, kl_run(tmp_path_factory, tiny_model_dir, rlvr_cli)


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory, rlvr_cli):
    out = tmp_path_factory.mktemp("report")
    proc = rlvr_cli("report", runs[0], runs[1], "--out", out, check=True)
    assert str(out / "report.html") in proc.stdout
    return out


def _is_real_plot(png_path):
    import matplotlib.image as mpimg

    img = mpimg.imread(png_path)
    h, w = img.shape[:2]
    assert w >= 500 and h >= 300, (png_path, img.shape)
    rgb = img[..., :3]
    colours = np.unique((rgb.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 50, f"{png_path}: only {len(colours)} colours"
    # not mostly blank: a real figure has axes, ticks, text and lines on white
    non_white = (rgb.min(axis=-1) < 0.9).mean()
    assert 0.01 < non_white < 0.9, f"{png_path}: {non_white:.1%} non-white pixels"
    return img


def test_report_writes_html_and_real_pngs(report):
    pngs = {p.stem: p for p in report.glob("*.png")}
    assert EXPECTED <= set(pngs), EXPECTED - set(pngs)
    for p in pngs.values():
        _is_real_plot(p)


def test_report_html_is_self_contained(report):
    page = (report / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == len(list(report.glob("*.png")))
    assert all(base64.b64decode(e)[:8] == b"\x89PNG\r\n\x1a\n" for e in embedded)
    assert not re.search(r'(src|href)="(?!data:)', page), "the page must not load anything"
    assert "<script" not in page
    # both runs, the doctor's verdict, held-out accuracy, best/worst completions
    assert page.count("<h3>") >= 2 and "No problems found" in page
    assert "held-out accuracy" in page.lower()
    assert "<h4>best</h4>" in page and "<h4>worst</h4>" in page and "digit_share" in page


def test_single_run_report_defaults_into_the_run_folder(runs, tmp_path):
    import shutil as sh

    run = tmp_path / "run"
    sh.copytree(runs[1], run, ignore=sh.ignore_patterns("final", "tb"))
    from rlvr.observe.report import make_report

    path = make_report([run])
    assert path == run / "report" / "report.html" and path.is_file()
    assert (run / "report" / "kl.png").is_file()
    assert not (run / "report" / "accuracy.png").exists()  # that run was not evaluated


def test_report_of_a_run_with_nan_steps(tmp_path):
    """A run that hit NaN still gets a report, and the doctor section says so."""
    from _runs import write_metrics

    from rlvr.observe.report import make_report
    from rlvr.observe.sinks import jsonable
    from test_doctor import SICK, synthetic

    run = write_metrics(tmp_path / "nan", [{k: jsonable(v) for k, v in m.items()} for m in synthetic(**SICK["non_finite"][0])])
    page = make_report([run]).read_text()
    assert "non_finite" in page and "no problems" not in page.lower()


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.browser
def test_report_renders_in_headless_chromium(report, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    shot = tmp_path / "report.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--hide-scrollbars",
    ]
    url = (report / "report.html").as_uri()
    proc = subprocess.run(
        [chromium, *flags, f"--screenshot={shot}", "--window-size=1400,2400", url], capture_output=True, text=True, timeout=120
    )
    assert shot.is_file(), proc.stderr[-3000:]
    img = _is_real_plot(shot)
    assert img.shape[1] == 1400
    # chromium logs every console message to stderr as `...:CONSOLE:<line>] "message", source: ...`
    console = _console_lines(proc.stderr)
    assert not console, console
    # ... which this check would see: a page with a console error is caught
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("boom")</script></body></html>')
    probe = subprocess.run([chromium, *flags, "--dump-dom", bad.as_uri()], capture_output=True, text=True, timeout=120)
    assert any("boom" in line for line in _console_lines(probe.stderr)), probe.stderr[-2000:]
    # the DOM after load: every image decoded (no broken data URIs)
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and dom.stdout.count("<img") == len(list(report.glob("*.png")))
    keep = report / "screenshot.png"
    shutil.copy(shot, keep)
