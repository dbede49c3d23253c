"""The examples in the codec's docstrings run as written (doctest)."""

from __future__ import annotations

import doctest

import pytest

from flodl_proto.codec import loopback


@pytest.mark.parametrize("func", [loopback.encode_len_framed], ids=lambda f: f.__name__)
def test_docstring_example_runs(func: object) -> None:
    """``encode_len_framed`` shows a user the ``b"".join`` its buffer list needs before
    ``decode_len_framed`` takes it, and the example's bytes are the wire's."""
    doc = getattr(func, "__doc__", None) or ""
    assert ">>> " in doc and 'b"".join(encode_len_framed(' in doc, doc
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(func, globs={}):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0 and results.failed == 0, results
