"""Seeded bug in the reference's creator (torch 2.14 on): a mixed backend string gets the whole group.

The creator returns the ReferenceProcessGroup itself for every string, as a Python backend had to before torch
2.14; torch then makes it the whole group of ``"cpu:reference,cuda:gloo"`` and drops the string's other parts, so
CUDA tensors reach no backend ('No backend type associated with device type cuda') while ``get_backend()`` still
names the string. Caught by suites/c10d/test_device_routing.py::test_each_device_gets_the_backend_the_string_names.
On torch 2.13 that is all torch offers a Python backend (the reference's gap): the gallery skips it there.
"""

from backends.reference import creator
from backends.reference.backend_form import ReferenceBackend
from tests.seeded.reference_base import ReferenceProcessGroup, register_reference

_made_as_the_reference = creator(ReferenceProcessGroup)


def create(dist_options, backend_options):
    made = _made_as_the_reference(dist_options, backend_options)
    return made.group if isinstance(made, ReferenceBackend) else made  # BUG: never the c10d Backend form


DISTCONFORM_SPEC = register_reference("reference_mixed_string_takes_over", ReferenceProcessGroup, create)
