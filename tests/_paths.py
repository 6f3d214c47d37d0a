"""Where the repository and the test folder are, for tests at any depth of tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
