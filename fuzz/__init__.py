"""Fuzzing for flodl-proto: atheris harnesses, their seed corpus and the corpus replay.

Nothing here imports :mod:`flodl_proto` at package import time, so the atheris driver
(``fuzz/driver.py``) can instrument the package before the harnesses load it.
"""
