"""Seeded bug in the native backend: PREMUL_SUM scales only the first rank's input.

The reduction kernel (native/collectives.cpp, planted bug ``premul_first_only``)
multiplies the first source by the factor and then adds every other rank's
input unscaled, a plausible slip when the factor is applied while the
accumulator is initialised. SUM, AVG and everything else stay right, so only
the PREMUL_SUM clause sees it (suites/c10d/test_dtypes.py::test_premul_sum:
every rank's input scaled by the factor, then summed).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_premul_first_only", "premul_first_only",
                                       "PREMUL_SUM scales only the first rank's input")
