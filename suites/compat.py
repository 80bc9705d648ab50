"""Names that moved between torch releases, resolved once for every suite.

torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to
all_gather_single / reduce_scatter_single (the old names still work but warn
on every call). Use the new name where it exists.
"""

import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
