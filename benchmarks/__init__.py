"""Speed and training-efficiency benchmarks. Never run by the tests; see ``python -m benchmarks``."""
