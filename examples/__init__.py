"""Importable example agents used by the README, the demo, the docs and the tests."""
