"""Seeded bug in the reference backend: ranks are trusted to call the same collective.

The fingerprint round still runs, but the agreement check is skipped, as in
a backend that exchanges sizes and hopes. Mismatched shapes, dtypes or
collectives then end however the data happens to line up: a rank returns a
partial result, or fails alone. Caught by the bad-input clause, which needs
an error on every rank.
"""

from tests.seeded.reference_base import ReferenceProcessGroup, register_reference


class NoAgreementCheck(ReferenceProcessGroup):
    """Ranks' fingerprints are exchanged but never compared."""

    def _check_agreement(self, seq, fingerprints):
        return None  # BUG: a disagreement goes unnoticed


DISTCONFORM_SPEC = register_reference("reference_no_agreement", NoAgreementCheck)
