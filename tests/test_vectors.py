"""Golden vectors: every case of ``$FLODL_VECTORS`` (default: the bundled copy,
``flodl_proto/_vectors``) and its ``v2/`` subfolder runs as one pytest case whose id is the
vector's id. Purely data-driven. A case whose op has no handler fails (it is never skipped or
expected to fail)."""

from __future__ import annotations

import pytest

from flodl_proto.interop.registry import OPS
from flodl_proto.interop.vectors import Case, iter_cases, manifest_total, run_case

from .conftest import vectors_root

ROOT = vectors_root()
CASES = list(iter_cases(ROOT)) if ROOT.is_dir() else []


def test_vector_folder_present() -> None:
    assert ROOT.is_dir(), f"vector folder {ROOT} not found (set FLODL_VECTORS)"
    assert CASES, f"no vector cases found in {ROOT}"


def test_case_count_matches_manifests() -> None:
    assert len(CASES) == manifest_total(ROOT)


def test_ids_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_every_op_has_a_handler() -> None:
    missing = sorted({c.data["op"] for c in CASES} - set(OPS))
    assert not missing, f"vector ops without a handler: {missing}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_vector(case: Case) -> None:
    run_case(case)  # NotImplementedOp (no handler) fails the case like a mismatch


#: vector files whose arithmetic goes through the bf16 kernels
KERNEL_FILES = ("reduce", "relay_fold", "bf16")
KERNEL_CASES = [c for c in CASES if c.file in KERNEL_FILES]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.id for c in KERNEL_CASES])
def test_vector_compiled_kernels(case: Case, compiled_kernels: None) -> None:
    """The same cases with every tensor sent to the compiled (numba) kernels."""
    run_case(case)
