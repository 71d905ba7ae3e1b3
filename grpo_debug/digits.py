"""Numbers at the digits every CPU computes alike.

A float32 sum of thousands of terms (a KL over every token, a loss, a gradient norm) holds about 5 significant
digits from one machine to another: MKL picks its own matmul kernels on an AVX-512 Intel CPU, on an AMD one and
under `MKL_CBWR`, and each rounds its last bits differently. A notebook's stored output that shows more digits
than that is a statement about the machine that executed it, so the notebooks show 3 (`setup` makes this pandas'
float format) and the cells' own asserts keep the exact checks. Below 1e-4 a number is written in scientific
notation, 0 included: a difference that is exactly 0 on one CPU is 1e-9 on another, and the notebooks' sanitizer
(`notebooks/sanitize.cfg`) compares all of them as float-rounding noise."""

import math

DIGITS = 3


def significant(x: float, digits: int = DIGITS) -> str:
    """`x` rounded to `digits` significant digits: fixed-point from 1e-4 up (no digit past the last significant
    one; an integer from 10**(digits - 1) up), scientific below 1e-4 and at 0; nan and inf as themselves."""
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    rounded = float(f"{x:.{digits - 1}e}")
    if abs(rounded) < 1e-4:
        return f"{rounded:.{digits - 1}e}"
    exponent = math.floor(math.log10(abs(rounded)))
    if exponent >= digits - 1:
        return f"{round(rounded):d}"
    return f"{rounded:.{digits - 1 - exponent}f}"


def order_of(x: float) -> str:
    """`x`'s power of ten ("1e+12"), for a number derived from float-rounding noise (how long a random walk of
    per-token noise takes to reach a cap): its order of magnitude is what it says on every CPU."""
    x = float(x)
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{math.copysign(1, x) * 10 ** round(math.log10(abs(x))):.0e}"
