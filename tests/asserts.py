"""Array assertions for the tests that never let a non-finite value pass.

NumPy's assert_allclose and assert_array_equal treat NaN as equal to NaN: two kernel paths that
both produce NaN everywhere "agree". Here a float result must be finite wherever what it is
compared with is finite, and two NaNs are never a match; a test that expects a NaN or an
infinity checks it by name (np.isnan, np.isinf), where the reader can see it.
"""

from __future__ import annotations

import numpy as np


def nonfinite_where_finite(got: np.ndarray, want: np.ndarray) -> str:
    """'' when got is finite wherever want is, else what and where (for a message)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype.kind not in "fc" or got.shape != np.broadcast_shapes(got.shape, want.shape):
        return ""
    wf = np.broadcast_to(np.isfinite(want) if want.dtype.kind in "fc" else True, got.shape)
    bad = ~np.isfinite(got) & wf
    if not bad.any():
        return ""
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{int(bad.sum())} non-finite value(s) where the expected value is finite, first at {first}: {got[first]}"


def _check(got, want, err_msg: str) -> None:
    why = nonfinite_where_finite(got, want)
    assert not why, f"{err_msg}: {why}" if err_msg else why
    for name, a in (("expected", want), ("actual", got)):
        a = np.asarray(a)
        if a.dtype.kind in "fc" and np.isnan(a).any():
            raise AssertionError(f"{err_msg + ': ' if err_msg else ''}NaN in the {name} array: "
                                 "compare NaN explicitly (np.isnan), never as a value")


def assert_close(got, want, rtol: float = 1e-7, atol: float = 0.0, err_msg: str = "") -> None:
    """np.testing.assert_allclose, except that NaN never matches and a non-finite value where the
    expected one is finite is named as such."""
    _check(got, want, err_msg)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=err_msg, equal_nan=False)


def assert_same(got, want, err_msg: str = "") -> None:
    """np.testing.assert_array_equal, except that NaN never matches (values compare as numbers:
    -0.0 == 0.0; compare .view(np.uint32) for bits)."""
    _check(got, want, err_msg)
    np.testing.assert_array_equal(got, want, err_msg=err_msg)


def assert_bits(got, want, err_msg: str = "") -> None:
    """Bit-identical float arrays (the cross-path rule), every value finite: two all-NaN results
    have equal bits and must still fail."""
    got, want = np.asarray(got), np.asarray(want)
    for name, a in (("expected", want), ("actual", got)):
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            first = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
            raise AssertionError(f"{err_msg + ': ' if err_msg else ''}{int((~np.isfinite(a)).sum())} non-finite "
                                 f"value(s) in the {name} array, first at {first}")
    assert got.shape == want.shape, f"{err_msg}: shape {got.shape} != {want.shape}"
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize] if got.dtype.kind == "f" else None
    np.testing.assert_array_equal(got.view(u) if u else got, want.view(u) if u else want, err_msg=err_msg)
