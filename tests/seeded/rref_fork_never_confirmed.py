"""Seeded bug: a user that receives an RRef forked by another user never asks the owner to confirm it.

The request runs at once and the RRef stays unconfirmed for good (the
reference agent before it confirmed forks, as torch does with its fork ACK).
Caught by the clause that reads ``confirmed_by_owner()`` inside the callee.
"""

import torch

from backends.reference.rpc.owners import OwnerTable
from tests.seeded.rpc_base import RpcBugHost, plant_in


def _skip_confirmation(original):
    def confirm(self, forks):
        done = torch.futures.Future()
        done.set_result([])  # BUG: no owner is asked; the forks stay unconfirmed
        return done
    return confirm


DISTCONFORM_SPEC = plant_in("rref_fork_never_confirmed", OwnerTable, "confirm", _skip_confirmation, RpcBugHost)
