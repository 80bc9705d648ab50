"""Seeded bug: RemoteModule installs ``forward`` / ``forward_async`` from functions named otherwise.

A bound method pickles as ``getattr(module, function.__name__)``; with the
functions named ``_forward`` / ``_forward_async`` (what the reference
RemoteModule did before), sending ``rm.forward`` or ``vars(rm)`` over RPC
fails on the receiver with AttributeError '_forward', where torch's runs
the remote module. Caught by the bound-forward clause.
"""

import types

from backends.reference.rpc import nn as reference_nn
from tests.seeded.training_base import plant


def _misnamed(original):
    def _install_generated_methods(self):
        for method in self.generated_methods:
            # BUG: the installed function's own name is not the attribute it is installed under
            renamed = types.FunctionType(method.__code__, method.__globals__, "_" + method.__name__,
                                         method.__defaults__, method.__closure__)
            setattr(self, method.__name__, types.MethodType(renamed, self))
    return _install_generated_methods


DISTCONFORM_SPEC = plant("remote_module_forward_unpicklable", reference_nn.RemoteModule,
                         "_install_generated_methods", _misnamed)
