"""The P/D accuracy suite of this repository: the packaged one (harness.pytest_suite), which a
downstream tree brings in with the same line."""
from harness.pytest_suite import *  # noqa: F401,F403
