"""DDP under uneven inputs: what a rank that ran out of data does while the others train.

torch's generic ``torch.distributed.algorithms.Join`` context runs the
protocol (every active rank all-reduces ones(1) before each iteration; a
joined rank all-reduces zeros(1) in a loop: the sum is the number of ranks
still training, 0 means everyone is done). While some rank is still
training, the joined rank calls ``main_hook`` once per iteration of the
others and must issue exactly the collectives their DDP issues in one
iteration, with neutral values ("shadowing"):

1. the bucket rebuild broadcasts (only once per training, only if due);
2. the buffer sync: agree on an authoritative rank (MAX all-reduce of
   rank-or--1, the joined rank offers -1), then the broadcast;
3. the "does this iteration sync gradients" all-reduce (the joined rank adds
   0; no_sync on the others makes the sum 0, then nothing else follows);
4. one all-reduce of zeros per bucket, in reducer order (through the comm
   hook if one is registered);
5. the all-reduce of the used-parameter map, with find_unused_parameters.

Active ranks divide the summed gradients by the initial world size
(``divide_by_initial_world_size=True``) or by the number of ranks not yet
joined (the all-reduce of ones from step 0 counts them). When all have
joined, ``post_hook`` broadcasts the model of the authoritative rank (the
highest rank among the last joiners) to everyone, and DDP keeps it in
``_authoritative_rank``.
"""

from __future__ import annotations

from torch.distributed.algorithms.join import JoinHook


class DDPJoinHook(JoinHook):
    def __init__(self, ddp, divide_by_initial_world_size: bool):
        self.ddp = ddp
        self.ddp._divide_by_initial_world_size = divide_by_initial_world_size
        super().__init__()

    def main_hook(self) -> None:
        """Shadow one iteration of the ranks still training."""
        ddp = self.ddp
        ddp.reducer.rebuild_buckets()
        ddp._check_and_sync_module_buffers()
        should_sync_backwards = ddp._check_global_requires_backward_grad_sync(is_joined_rank=True)
        # the others skip the parameter sync in their next forward when they skipped the gradient sync
        ddp.require_forward_param_sync = should_sync_backwards
        if not should_sync_backwards:
            return
        ddp._match_all_reduce_for_bwd_pass()
        if ddp.find_unused_parameters:
            ddp._match_unused_params_allreduce()
        ddp.reducer.push_all_rebuilt_params()

    def post_hook(self, is_last_joiner: bool) -> None:
        """Everyone has joined: make the model the same on all ranks."""
        self.ddp._sync_final_model(is_last_joiner)
