"""The repository itself works from a fresh clone: it tracks no symlink (a link into one machine's
temporary folder once broke `make test-vllm` on every clone), and every Makefile target the docs
name exists and makes a plan there."""

import re
import shutil
import subprocess
from _paths import REPO

ROOT = REPO


def _tracked() -> list[tuple[str, str]]:
    """(mode, path) of every file git tracks, as `git ls-files -s` lists them (working-tree index)."""
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [(line.split()[0], line.split("\t", 1)[1]) for line in out.splitlines()]


def test_the_repository_tracks_no_link_and_nothing_outside_itself():
    tracked = _tracked()
    assert len(tracked) > 50  # the listing really is the repository's
    links = [p for mode, p in tracked if mode == "120000"]  # symlinks: they point wherever they like
    gitlinks = [p for mode, p in tracked if mode == "160000"]  # submodules: another repository's files
    assert not links and not gitlinks, (links, gitlinks)
    assert all(mode in ("100644", "100755") for mode, _ in tracked)
    assert all((ROOT / p).resolve().is_relative_to(ROOT) for _, p in tracked)
    ignored = subprocess.run(["git", "ls-files", "-ci", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert not ignored.strip(), f"tracked files that .gitignore excludes (e.g. a venv): {ignored}"


def _documented_targets() -> set[str]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md"]
    return {t for d in docs for t in re.findall(r"\bmake ([a-z][\w-]*)", d.read_text())}


def test_every_documented_make_target_plans_in_a_fresh_copy(tmp_path):
    """`make -n TARGET` in a copy of exactly the tracked files (what a clone holds): each target the
    README or docs name exists, and its plan (venv creation, installs, the test command) is printed."""
    targets = _documented_targets()
    assert {"demo", "test", "test-vllm", "test-browser"} <= targets
    phony = set(re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split())
    assert targets <= phony, f"documented but not in the Makefile: {targets - phony}"
    clone = tmp_path / "clone"
    for _, p in _tracked():
        (clone / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / p, clone / p)
    for target in sorted(targets):
        proc = subprocess.run(["make", "-n", target], cwd=clone, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (target, proc.stderr)
        assert proc.stdout.strip(), f"make -n {target} plans nothing in a fresh clone"
    plan = subprocess.run(["make", "-n", "test-vllm"], cwd=clone, capture_output=True, text=True, check=True).stdout
    assert "-m venv .venv-vllm" in plan and "pytest -q -m vllm" in plan
