#!/usr/bin/env python3
"""Fits the tables of the host platform's f32 erf (runtime/src/platform/host/vmath.rs).

erf(a) for a = |x| in [0, 4) is a · g_i(a - c_i), where interval i is
[i/2, (i+1)/2), c_i its middle and g_i a degree-6 polynomial fitted to
erf(a)/a on it (least squares on Chebyshev nodes, relative weight). The
polynomials are evaluated in f32 with fused multiply-adds; this script
checks that evaluation, simulated with numpy, against math.erf on a fine
grid and prints the worst error in ulps and the Rust table.

Run: .venv/bin/python scripts/fit_erf.py
"""

import math

import numpy as np

INTERVALS = 8
WIDTH = 0.5
DEGREE = 6


def ratio(a):
    return np.array([math.erf(v) / v if v > 0 else 2 / math.sqrt(math.pi) for v in a])


def fit():
    table = np.zeros((DEGREE + 1, INTERVALS), dtype=np.float32)
    nodes = 4000
    j = np.arange(nodes)
    for i in range(INTERVALS):
        c = (i + 0.5) * WIDTH
        x = c + WIDTH / 2 * np.cos(np.pi * (j + 0.5) / nodes)
        y = ratio(x)
        v = np.vander(x - c, DEGREE + 1, increasing=True)
        coef, *_ = np.linalg.lstsq(v / y[:, None], np.ones_like(y), rcond=None)
        table[:, i] = coef.astype(np.float32)
    return table


def fma(a, b, c):
    # a*b is exact in f64 for f32 operands; one rounding to f64, then f32.
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def erf32(x, table):
    top = np.float32(INTERVALS * WIDTH)
    a = np.minimum(np.abs(x), top)
    i = np.minimum((a * np.float32(1 / WIDTH)).astype(np.int32), INTERVALS - 1)
    c = i.astype(np.float32) * np.float32(WIDTH) + np.float32(WIDTH / 2)
    z = (a - c).astype(np.float32)
    p = table[DEGREE][i]
    for k in range(DEGREE - 1, -1, -1):
        p = fma(p, z, table[k][i])
    r = np.where(a >= top, np.float32(1), np.minimum(p * a, np.float32(1)))
    return np.copysign(r, x)


def main():
    table = fit()
    x = np.arange(0, 4.5, 1e-6, dtype=np.float64).astype(np.float32)
    got = erf32(x, table).astype(np.float64)
    want = np.array([math.erf(float(v)) for v in x])
    w32 = want.astype(np.float32)
    ulp = np.maximum(np.abs(w32).astype(np.float64), 1.1754944e-38) * 2.0**-23
    err = np.where(got == w32, 0, np.abs(got - want) / ulp)
    print(f"// worst {err.max():.2f} ulps (at {x[err.argmax()]}), mean {err.mean():.3f}")
    print(f"const ERF_TABLE: [[f32; {INTERVALS}]; {DEGREE + 1}] = [")
    for row in table:
        print("    [" + ", ".join(str(np.float32(v)) for v in row) + "],")
    print("];")


if __name__ == "__main__":
    main()
