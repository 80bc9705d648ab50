"""Every seeded bug of tests/seeded/, declared: the one place the gallery learns what to run and what must catch it.

One ``SeededBug`` (tests/gallery_record.py) per bug module, named after it.
The gallery (tests/test_seeded_bugs.py) reads this module and never imports a
bug module into its own process, where the bug would be planted. Adding a bug:
write tests/seeded/<name>.py (it registers backend ``<name>`` and plants the
bug) and add its record here, naming the clause(s) whose check must fail on
it; run ``pytest tests/test_seeded_bugs.py -k <name>`` and the gallery says
whether that clause caught it, another one did, or the module crashed.

``clauses`` are those a gallery run saw fail (tests/gallery_failures.py
records each failure), not guesses: run a new bug with a clause you expect
and the verdict names the one that actually failed.
"""

from __future__ import annotations

from tests.gallery_record import SeededBug

BUGS: tuple[SeededBug, ...] = (
    # Seeded bug: all_gather fills the output list in the wrong order (rotated by one).
    SeededBug(
        name='all_gather_wrong_order',
        wraps_gloo=True,
        contract="all_gather into a list: entry i on every rank is rank i's tensor",
        clauses=('suites/c10d/test_gather_scatter.py::test_all_gather_list',),
        suite='suites/c10d/test_gather_scatter.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_to_all_single ignores uneven split sizes and splits evenly.
    SeededBug(
        name='all_to_all_splits_ignored',
        wraps_gloo=True,
        contract='all_to_all_single with uneven split sizes puts every chunk in place',
        clauses=('suites/c10d/test_all_to_all.py::test_all_to_all_single',),
        suite='suites/c10d/test_all_to_all.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_to_all_single lays out what it receives by the *input* split sizes.
    SeededBug(
        name='all_to_all_splits_swapped',
        wraps_gloo=True,
        contract='all_to_all_single with asymmetric uneven splits puts every chunk in place',
        clauses=('suites/c10d/test_all_to_all.py::test_all_to_all_single',),
        suite='suites/c10d/test_all_to_all.py',
        shares_a_run=True,
    ),
    # Seeded bug: the tensor form of all_gather lays the ranks' pieces out in reverse rank order.
    SeededBug(
        name='allgather_base_reversed',
        wraps_gloo=True,
        contract='FSDP2 training for several steps equals single-process training on the whole batch',
        clauses=('suites/parallel/test_fsdp.py::test_fsdp2_matches_baseline',),
        suite='suites/parallel/test_fsdp.py',
        shares_a_run=True,
    ),
    # Seeded bug: the coalesced tensor-form all_gather lays the ranks' pieces out in reverse rank order.
    SeededBug(
        name='allgather_coalesced_reversed',
        wraps_gloo=True,
        contract='DTensor Shard(0) -> Replicate leaves every rank its exact piece; full_tensor() is the full tensor',
        clauses=('suites/parallel/test_dtensor.py::test_redistribute',),
        suite='suites/parallel/test_dtensor.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_reduce SUM leaves out the last rank's contribution.
    SeededBug(
        name='allreduce_misses_last_rank',
        wraps_gloo=True,
        contract='DTensor Partial -> Replicate leaves every rank the full tensor (one all_reduce)',
        clauses=('suites/parallel/test_dtensor.py::test_redistribute',),
        suite='suites/parallel/test_dtensor.py',
        keyword='partial_to_replicate',
        shares_a_run=True,
    ),
    # Seeded bug: async all_reduce reports completion before the result has landed.
    SeededBug(
        name='async_early_completion',
        wraps_gloo=True,
        contract='all_reduce(async_op=True): after wait() the result is complete and exact',
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce_async',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug: the distributed backward takes leaf gradients with ``torch.autograd.grad``, never running AccumulateGrad.
    SeededBug(
        name='autograd_accumulate_hooks_skipped',
        wraps_gloo=True,
        contract="A post hook on a leaf's AccumulateGrad node runs exactly once per distributed backward; .grad stays None",
        clauses=('suites/dist_autograd/test_backward.py::test_accumulate_grad_post_hook_runs_once_per_backward',),
        suite='suites/dist_autograd/test_backward.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: a released context is forgotten only by its creator; the workers it reached keep it forever.
    SeededBug(
        name='autograd_context_leak',
        wraps_gloo=True,
        contract='After the with block exits the creator has no such context and the callee loses it too',
        clauses=('suites/dist_autograd/test_cleanup.py::test_callee_releases_the_context',),
        suite='suites/dist_autograd/test_cleanup.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: backward returns once the caller's own part ran, without waiting for the workers it sent gradients to.
    SeededBug(
        name='autograd_early_return',
        wraps_gloo=True,
        contract='A callee branch that does not lead back to the caller (a self-call with a slow backward) has finished when backward returns',
        clauses=('suites/dist_autograd/test_chains.py::test_backward_returns_after_every_workers_part',),
        suite='suites/dist_autograd/test_chains.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: distributed backward accumulates leaf gradients into ``.grad`` instead of the context.
    SeededBug(
        name='autograd_grad_attribute',
        wraps_gloo=True,
        contract='loss = rpc_sync(peer, mul, (t1, t2)).sum(): get_gradients gives t1 -> t2 and t2 -> t1; .grad is untouched',
        clauses=('suites/dist_autograd/test_backward.py::test_one_root_gradients_land_in_the_context',),
        suite='suites/dist_autograd/test_backward.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: backward ignores ``retain_graph=True`` and frees every worker's graph after each pass.
    SeededBug(
        name='autograd_retain_ignored',
        wraps_gloo=True,
        contract='Three backward passes with retain_graph=True through a remote mul leave 1x, 2x, 3x the gradient',
        clauses=('suites/dist_autograd/test_retain_graph.py::test_retain_graph_passes_accumulate',),
        suite='suites/dist_autograd/test_retain_graph.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the caller's send functions run on the agent thread that delivered their gradients.
    SeededBug(
        name='autograd_send_runs_off_caller',
        wraps_gloo=True,
        contract='A profiled backward on the caller records the torch::distributed::autograd::backward range and the SendRpcBackward and RecvRpcBackward it ran',
        clauses=('suites/dist_autograd/test_profiled_backward.py::test_profiled_backward_records_its_range_and_send_and_recv_functions',),
        suite='suites/dist_autograd/test_profiled_backward.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: a recv function sends its gradients to the context's creator instead of the worker that sent the message.
    SeededBug(
        name='autograd_wrong_worker',
        wraps_gloo=True,
        contract="A -> B -> A: the callee calls back into the caller; gradients equal the local graph's",
        clauses=('suites/dist_autograd/test_chains.py::test_chain_back_to_the_caller',),
        suite='suites/dist_autograd/test_chains.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: all_reduce AVG is computed as SUM (the division by world size is forgotten).
    SeededBug(
        name='avg_as_sum',
        wraps_gloo=True,
        contract='all_reduce AVG is the mean over ranks, not the sum',
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_reduce reports success with stale outputs when the network fails under it.
    SeededBug(
        name='gloo_swallows_network_errors',
        wraps_gloo=True,
        contract='under a network fault every rank\'s collective raises a RuntimeError, none succeeds',
        clauses=('suites/faults/test_network_faults.py::test_every_rank_gets_a_runtime_error',),
        suite='suites/faults/test_network_faults.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_reduce retries a broken connection forever instead of raising.
    SeededBug(
        name='gloo_retries_forever',
        wraps_gloo=True,
        contract='under a network fault every call returns or raises within its timeout plus the stated slack',
        clauses=('suites/faults/test_network_faults.py::test_the_operation_ends_within_its_timeout',),
        suite='suites/faults/test_network_faults.py',
        shares_a_run=True,
    ),
    # Seeded bug: once an all_reduce failed under a network fault, later ones report success with stale outputs.
    SeededBug(
        name='gloo_stale_after_partition',
        wraps_gloo=True,
        contract='after healing, the group that timed out is what the backend declares (gloo: every call raises at once)',
        clauses=('suites/faults/test_network_faults.py::test_after_healing_the_group_is_as_declared',),
        suite='suites/faults/test_network_faults.py',
        shares_a_run=True,
    ),
    # Seeded bug: abort() first waits for a barrier with the peers, which never succeeds during a partition.
    SeededBug(
        name='gloo_abort_waits_for_peers',
        wraps_gloo=True,
        contract="aborting a group during a network fault returns within the group's timeout plus the slack",
        clauses=('suites/faults/test_network_faults.py::test_abort_returns_within_the_bound',),
        suite='suites/faults/test_network_faults.py',
        shares_a_run=True,
    ),
    # Seeded bug: shutdown() (destroy_process_group) first waits for a barrier with the peers.
    SeededBug(
        name='gloo_shutdown_waits_for_peers',
        wraps_gloo=True,
        contract="destroy_process_group during a network fault returns within the group's timeout plus the slack",
        clauses=('suites/faults/test_network_faults.py::test_destroy_returns_within_the_bound',),
        suite='suites/faults/test_network_faults.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: a send waits for the peer's window without a deadline.
    SeededBug(
        name='reference_send_unbounded',
        contract="every operation under a network fault ends within its timeout plus the slack",
        clauses=('suites/faults/test_network_faults.py::test_the_operation_ends_within_its_timeout',),
        suite='suites/faults/test_network_faults.py::test_the_operation_ends_within_its_timeout',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's connection code: a lazy group's first connection ignores its timeout.
    SeededBug(
        name='reference_connect_ignores_its_timeout',
        contract="a group's first collective under a fault before its first connection ends within its timeout",
        clauses=('suites/faults/test_network_faults.py::test_the_first_collective_ends_within_its_timeout',),
        suite='suites/faults/test_network_faults.py::test_the_first_collective_ends_within_its_timeout',
        options=('--faults', 'partition'),
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's send: isend writes the whole message on the caller's thread.
    SeededBug(
        name='reference_send_blocks_caller',
        contract="under a fault that cuts a p2p, the sender's isend returns its Work at once; only wait() waits",
        clauses=('suites/faults/test_network_faults.py::test_isend_returns_at_once_under_the_fault',),
        suite='suites/faults/test_network_faults.py::test_isend_returns_at_once_under_the_fault',
        options=('--faults', 'partition'),
        shares_a_run=True,
    ),
    # Seeded bug in the native backend, under a network fault: a shrunk group still counts the rank it excluded.
    SeededBug(
        name='shrink_under_fault_waits_for_the_cut_rank',
        builds=('native',),
        contract="under a fault the reachable ranks shrink_group the cut-off rank away and all_reduce on the rest, exact",
        clauses=('suites/faults/test_network_faults.py::test_the_reachable_ranks_shrink_the_group',),
        suite='suites/faults/test_network_faults.py::test_the_reachable_ranks_shrink_the_group',
        options=('--faults', 'frozen'),
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: ending a group first completes its connections, without a deadline.
    SeededBug(
        name='reference_shutdown_completes_the_mesh',
        contract="a group whose first collective failed under a fault before its first connection ends within the bound",
        clauses=('suites/faults/test_network_faults.py::test_the_group_ends_after_its_first_collective_failed',),
        suite='suites/faults/test_network_faults.py::test_the_group_ends_after_its_first_collective_failed',
        options=('--faults', 'refused'),
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's own flight recorder: a collective that failed is recorded completed.
    SeededBug(
        name='reference_fr_failure_completed',
        contract="once a collective raised under a network fault, each rank's flight recorder does not say it completed",
        clauses=('suites/faults/test_fault_flight_recorder.py::test_the_failed_collective_is_never_recorded_completed',),
        suite='suites/faults/test_fault_flight_recorder.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's own flight recorder: a collective is recorded only once its Work ended.
    SeededBug(
        name='reference_fr_recorded_when_done',
        contract="while a collective waits under a network fault, each rank's flight recorder shows it, not completed",
        clauses=('suites/faults/test_fault_flight_recorder.py::test_the_recorder_shows_the_collective_each_rank_waits_in',),
        suite='suites/faults/test_fault_flight_recorder.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's own flight recorder: a barrier is recorded completed as soon as it is issued.
    SeededBug(
        name='reference_fr_barrier_done_at_once',
        contract="while a barrier waits under a network fault, each rank's flight recorder shows it, not completed",
        clauses=('suites/faults/test_fault_flight_recorder.py::test_the_recorder_shows_the_collective_each_rank_waits_in',
                 'suites/faults/test_fault_flight_recorder.py::test_the_failed_collective_is_never_recorded_completed'),
        suite='suites/faults/test_fault_flight_recorder.py',
        shares_a_run=True,
    ),
    # Seeded bug: recv reports success with a stale buffer when the network fails under it.
    SeededBug(
        name='gloo_recv_swallows_network_errors',
        wraps_gloo=True,
        contract='under a network fault the receiver of a p2p from the cut-off rank raises a RuntimeError',
        clauses=('suites/faults/test_network_faults.py::test_every_rank_gets_a_runtime_error',),
        suite='suites/faults/test_network_faults.py',
        shares_a_run=True,
    ),
    # Seeded bug: barrier does not wait for the other ranks.
    SeededBug(
        name='barrier_no_wait',
        wraps_gloo=True,
        contract='barrier: no rank leaves before the last rank has entered',
        clauses=('suites/c10d/test_barrier.py::test_barrier_waits_for_the_late_rank',),
        suite='suites/c10d/test_barrier.py',
        shares_a_run=True,
    ),
    # Seeded bug: broadcast always sends from rank 0, whatever ``src`` says.
    SeededBug(
        name='broadcast_wrong_root',
        wraps_gloo=True,
        contract="broadcast(src=root) leaves every rank with the root's tensor, for every root",
        clauses=('suites/c10d/test_broadcast_reduce.py::test_broadcast_from_every_root',),
        suite='suites/c10d/test_broadcast_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug: the completion hook fires twice for every Work.
    SeededBug(
        name='completion_hook_twice',
        contract='_register_on_completion_hook fires once per Work',
        clauses=('suites/c10d/test_backend_state.py::test_completion_hook_fires_once_per_work',),
        suite='suites/c10d/test_backend_state.py',
        shares_a_run=True,
    ),
    # Seeded bug: complex tensors are all-reduced as their real view, whatever the op.
    SeededBug(
        name='complex_reduced_as_real',
        wraps_gloo=True,
        contract="the group's allreduce of complex tensors with MIN or MAX raises",
        clauses=('suites/c10d/test_dtypes.py::test_complex_all_reduce_unordered_op_raises',),
        suite='suites/c10d/test_dtypes.py',
        shares_a_run=True,
    ),
    # Seeded bug in the dcdev backend: a Work completes before its results are copied back onto the device.
    SeededBug(
        name='dcdev_early_completion',
        builds=('native', 'dcdev'),
        contract='all_reduce(async_op=True): after wait() the result is complete and exact',
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce_async',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=False,  # registers the dcdev device in every process of its run
    ),
    # Seeded bug in the dcdev backend: it reads device memory from the host instead of through the device's copy.
    SeededBug(
        name='dcdev_host_reads_device',
        builds=('native', 'dcdev'),
        contract="a backend reaches a device tensor's data through the device's copy only",
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=False,
    ),
    # Seeded bug in the device binding: every rank binds device index 0, whatever its local rank.
    SeededBug(
        name='dcdev_rank_on_device_zero',
        builds=('native', 'dcdev'),
        contract='each rank works on its own device: torch.accelerator reports its index current',
        clauses=('suites/c10d/test_registration.py::test_each_rank_works_on_its_own_device',),
        suite='suites/c10d/test_registration.py',
        shares_a_run=False,  # replaces fixtures.devices.bind_rank_to_device in its ranks
    ),
    # Seeded bug in the reference DDP: buckets handed to the reducer in assignment order, not reversed.
    SeededBug(
        name='ddp_bucket_order_reversed',
        wraps_gloo=True,
        contract='with find_unused_parameters buckets are reversed: bucket 0 holds the last-defined parameters',
        clauses=('suites/ddp/test_buckets.py::test_find_unused_buckets_are_reversed_with_a_small_first_bucket',),
        suite='suites/ddp/',
        shares_a_run=True,
    ),
    # Seeded bug: every 7th all_reduce silently does nothing.
    SeededBug(
        name='ddp_drop_allreduce',
        wraps_gloo=True,
        contract='DDP gradients equal the single-process gradients on the concatenated batch',
        clauses=('suites/ddp/test_gradients.py::test_mean_loss_gradients_equal_baseline',),
        suite='suites/ddp/test_gradients.py',
        shares_a_run=True,
    ),
    # Seeded bug: the reference DDP reducer never sees the distributed autograd context its hooks run in.
    SeededBug(
        name='ddp_reducer_ignores_autograd_context',
        wraps_gloo=True,
        contract='DDP backward inside a context: get_gradients holds the average over ranks; .grad stays None',
        clauses=('suites/dist_autograd/test_ddp.py::test_ddp_inside_a_context_averages_into_the_context',),
        suite='suites/dist_autograd/test_ddp.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug in the reference DDP: under Join, gradients always divided by the initial world size.
    SeededBug(
        name='ddp_join_divide_factor',
        wraps_gloo=True,
        contract='under Join, divide_by_initial_world_size=False averages over the ranks not yet joined',
        clauses=('suites/ddp/test_join.py::test_join_gradients_per_iteration',),
        suite='suites/ddp/test_join.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference DDP: unused parameters found, but never marked ready.
    SeededBug(
        name='ddp_unused_unmarked',
        wraps_gloo=True,
        contract='rank-dependent control flow with find_unused_parameters gives every rank the average',
        clauses=('suites/ddp/test_unused.py::test_rank_dependent_control_flow',),
        suite='suites/ddp/test_unused.py',
        shares_a_run=True,
    ),
    # Seeded bug: a plugin backend that leaves collective checking to torch's DETAIL wrapper, which never sees it.
    SeededBug(
        name='debug_unwrapped_gloo',
        wraps_gloo=True,
        contract='Under TORCH_DISTRIBUTED_DEBUG=DETAIL an all_reduce with mismatched shapes raises on every rank naming both shapes',
        clauses=('suites/parallel/test_debug.py::test_detail_reports_shape_mismatch',),
        suite='suites/parallel/test_debug.py',
        options=('--debug-level', 'DETAIL',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference DistributedOptimizer waits for its owners but drops their exceptions.
    SeededBug(
        name='dist_optimizer_errors_swallowed',
        wraps_gloo=True,
        contract="An owner's optimizer raising in its constructor makes DistributedOptimizer(...) raise with its text",
        clauses=('suites/dist_autograd/test_optimizer.py::test_exception_in_optimizer_constructor_propagates',),
        suite='suites/dist_autograd/test_optimizer.py',
        keyword='optimizer_constructor_propagates',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference DistributedOptimizer steps every parameter with its first gradient forever.
    SeededBug(
        name='dist_optimizer_stale_gradients',
        wraps_gloo=True,
        contract='Weights on two other workers trained with DistributedOptimizer equal local training (same data, N steps)',
        clauses=('suites/dist_autograd/test_optimizer.py::test_training_on_two_owners_equals_local',),
        suite='suites/dist_autograd/test_optimizer.py',
        keyword='two_owners_equals_local',
        options=('--rpc-agent', 'reference-tp', '--world-size', '3',),
        shares_a_run=False,
    ),
    # Seeded bug: floating-point SUM/AVG adds the ranks' contributions in a varying order.
    SeededBug(
        name='float_sum_order_varies',
        wraps_gloo=True,
        contract='all_reduce of random floats, repeated, gives identical bits every time and on every rank',
        clauses=('suites/parallel/test_determinism.py::test_all_reduce_bitwise_repeatable',),
        suite='suites/parallel/test_determinism.py',
        options=('--world-size', '3',),
        shares_a_run=True,
    ),
    # Seeded bug: all_reduce runs on a second communicator whose sequence ids are its own.
    SeededBug(
        name='fr_sequence_per_communicator',
        wraps_gloo=True,
        contract='each collective leaves one entry per rank with its name, sizes, dtypes, group and an agreed sequence id',
        clauses=('suites/c10d/test_flight_recorder.py::test_collectives_recorded',),
        suite='suites/c10d/test_flight_recorder.py',
        shares_a_run=True,
    ),
    # Seeded bug (the one in all_to_all_splits_swapped.py) seen through functional collectives.
    SeededBug(
        name='funcol_all_to_all_splits_swapped',
        wraps_gloo=True,
        contract='funcol.all_to_all_single sends split j of rank i to rank j at position i, uneven splits',
        clauses=('suites/parallel/test_functional.py::test_funcol_all_to_all_single',),
        suite='suites/parallel/test_functional.py',
        keyword='all_to_all',
        shares_a_run=True,
    ),
    # Seeded bug: the tensor-form collectives report completion before their data has landed.
    SeededBug(
        name='funcol_wait_early',
        wraps_gloo=True,
        contract='Collectives issued back to back complete independently: wait_tensor gives each its own exact result',
        clauses=('suites/parallel/test_functional.py::test_funcol_wait_tensor_in_flight',),
        suite='suites/parallel/test_functional.py',
        keyword='in_flight',
        shares_a_run=True,
    ),
    # Seeded bug: gather fills the root's list in reverse rank order.
    SeededBug(
        name='gather_list_reversed',
        wraps_gloo=True,
        contract="gather(dst=root): entry i of the root's list is rank i's tensor, for every root",
        clauses=('suites/c10d/test_gather_scatter.py::test_gather_to_every_root',),
        suite='suites/c10d/test_gather_scatter.py',
        shares_a_run=True,
    ),
    # Seeded bug: once an all_reduce of a group timed out, the group's next all_reduce never completes.
    SeededBug(
        name='group_hangs_after_timeout',
        wraps_gloo=True,
        contract="after a timeout the group's next collective succeeds or fails at once, as declared; never a hang",
        clauses=('suites/c10d/test_timeouts.py::test_group_after_a_timeout_behaves_as_declared',),
        suite='suites/c10d/test_timeouts.py::test_group_after_a_timeout_behaves_as_declared',
        hangs=True,
        shares_a_run=True,
    ),
    # Seeded bug: int64 all_reduce accumulates in float64, losing the low bits.
    SeededBug(
        name='int64_through_float64',
        wraps_gloo=True,
        contract='all_reduce of int64 is exact (inputs near 2**55 do not fit in a double)',
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug: a large all_reduce is split into chunks and the last chunk is never reduced.
    SeededBug(
        name='lost_chunk',
        wraps_gloo=True,
        contract='all_reduce of a 4 MiB tensor reduces every element',
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce_shapes',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: abort() leaves a collective in flight waiting until its deadline.
    SeededBug(
        name='native_abort_waits',
        builds=('native',),
        contract='A Work pending on a group that is aborted fails at once (well within 3 s)',
        clauses=('suites/c10d/test_lifecycle.py::test_abort_fails_pending_work',),
        suite='suites/c10d/test_lifecycle.py',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: recv from any source reports rank 0 as the sender.
    SeededBug(
        name='native_any_source_rank0',
        builds=('native',),
        contract='recv without src returns the rank that sent the message',
        clauses=('suites/p2p/test_send_recv.py::test_recv_any_source_reports_sender',),
        suite='suites/p2p/test_send_recv.py',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: complex tensors are reduced as their real view, whatever the op.
    SeededBug(
        name='native_complex_as_real',
        builds=('native',),
        contract='reduce and reduce_scatter_tensor of complex tensors: SUM exact, PRODUCT complex or refused, MAX refused',
        clauses=('suites/c10d/test_dtypes.py::test_complex_reduce_and_reduce_scatter',),
        suite='suites/c10d/test_dtypes.py',
        keyword='complex_reduce_and_reduce_scatter',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: a collective's Work completes before its data has landed.
    SeededBug(
        name='native_early_completion',
        builds=('native',),
        contract='the future completes only after the data has landed',
        clauses=('suites/c10d/test_work.py::test_completed_work_reports_success_and_values',
                 # the same early completion, seen by whichever clause's wait loses the race to the copy
                 'suites/c10d/test_work.py::test_future_completes_after_the_data_has_landed'),
        suite='suites/c10d/test_work.py',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend's own flight recorder: entries are never marked completed.
    SeededBug(
        name='native_fr_never_completed',
        builds=('native',),
        contract='An entry leaves "scheduled" once its Work completed: every waited call\'s state is "completed".',
        clauses=('suites/c10d/test_flight_recorder.py::test_entries_complete_with_their_work',),
        suite='suites/c10d/test_flight_recorder.py',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: a merged group keeps its parent's timeout, not the one merge was given.
    SeededBug(
        name='native_merge_ignores_timeout',
        builds=('native',),
        contract='a merged group times out after the timeout merge_remote_group was given',
        clauses=('suites/c10d/test_shrink_and_options.py::test_merge_remote_group',),
        suite='suites/c10d/test_shrink_and_options.py',
        keyword='test_merge_remote_group',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: the group's timeout never fires.
    SeededBug(
        name='native_no_timeout',
        builds=('native',),
        contract="a collective one rank skips raises within the group's timeout",
        clauses=('suites/c10d/test_timeouts.py::test_skipped_collective_raises_within_group_timeout',),
        suite='suites/c10d/test_timeouts.py',
        hangs=True,
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: PREMUL_SUM scales only the first rank's input.
    SeededBug(
        name='native_premul_first_only',
        builds=('native',),
        contract="PREMUL_SUM(factor) scales every rank's input by the factor, then sums",
        clauses=('suites/c10d/test_dtypes.py::test_premul_sum',),
        suite='suites/c10d/test_dtypes.py',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: a shrink ignores the pg_options it is given.
    SeededBug(
        name='native_shrink_ignores_options',
        builds=('native',),
        contract='a shrunk group times out after the timeout its own pg_options give',
        clauses=('suites/c10d/test_shrink_and_options.py::test_shrunk_group_times_out_as_its_options_say',),
        suite='suites/c10d/test_shrink_and_options.py',
        keyword='test_shrunk_group_times_out_as_its_options_say',
        options=('--world-size', '3',),
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's shrink (torch 2.14 on): the shrunk group ignores its pg_options.
    SeededBug(
        name='reference_shrink_ignores_options',
        torch='>=2.14',
        contract='a shrunk group times out after the timeout its own pg_options give',
        clauses=('suites/c10d/test_shrink_and_options.py::test_shrunk_group_times_out_as_its_options_say',),
        suite='suites/c10d/test_shrink_and_options.py',
        keyword='test_shrunk_group_times_out_as_its_options_say',
        options=('--world-size', '3',),
        shares_a_run=True,
    ),
    # Seeded bug in the reference's creator (torch 2.14 on): a mixed string gets the whole group.
    SeededBug(
        name='reference_mixed_string_takes_over',
        torch='>=2.14',
        contract='in a mixed backend string each device is served by the backend the string names for it',
        clauses=('suites/c10d/test_device_routing.py::test_each_device_gets_the_backend_the_string_names',),
        suite='suites/c10d/test_device_routing.py',
        keyword='test_each_device_gets_the_backend_the_string_names',
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: a shrunk group still counts the ranks it excluded.
    SeededBug(
        name='native_shrink_waits_for_excluded',
        builds=('native',),
        contract="after a rank's process died, the others shrink the default group and reduce over it",
        clauses=('suites/c10d/test_shrink_and_options.py::test_shrink_after_a_rank_was_killed',),
        suite='suites/c10d/test_shrink_and_options.py',
        keyword='test_shrink_after_a_rank_was_killed',
        hangs=True,
        shares_a_run=True,
    ),
    # Seeded bug in the native backend: every reduction leaves out the last rank's contribution.
    SeededBug(
        name='native_skip_last_rank',
        builds=('native',),
        contract="all_reduce gives every rank the exact reduction of all ranks' inputs",
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_gather into non-contiguous output tensors loses the result.
    SeededBug(
        name='non_contiguous_lost',
        wraps_gloo=True,
        contract='all_gather into a list of strided (non-contiguous) views fills the views',
        clauses=('suites/c10d/test_non_contiguous.py::test_all_gather_strided_views',),
        suite='suites/c10d/test_non_contiguous.py',
        shares_a_run=True,
    ),
    # Seeded bug: send/recv ignore the tag; messages match in arrival order.
    SeededBug(
        name='p2p_tags_ignored',
        wraps_gloo=True,
        contract='send/recv match by tag, not by arrival order',
        clauses=('suites/p2p/test_send_recv.py::test_tags_select_the_message',),
        suite='suites/p2p/test_send_recv.py',
        shares_a_run=True,
    ),
    # Seeded bug: isend returns only once the message is delivered (rendezvous semantics).
    SeededBug(
        name='isend_waits_for_the_receiver',
        wraps_gloo=True,
        contract='isend returns before the receiver posts its recv; only wait() waits',
        clauses=('suites/p2p/test_send_recv.py::test_isend_returns_before_the_receiver_posts_its_recv',),
        # its clause alone: every other case of the file deadlocks on it (a send that waits for a receive posted
        # after it) and ran into the 30 s harness deadline, five of them 150 s of a gallery run
        suite='suites/p2p/test_send_recv.py::test_isend_returns_before_the_receiver_posts_its_recv',
        shares_a_run=True,
    ),
    # Seeded bug: recv from any source reports the wrong sender.
    SeededBug(
        name='recv_anysource_wrong_sender',
        wraps_gloo=True,
        contract='recv without src returns the rank that actually sent the message',
        clauses=('suites/p2p/test_send_recv.py::test_recv_any_source_reports_sender',),
        suite='suites/p2p/test_send_recv.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_reduce ignores the requested reduce op and always sums.
    SeededBug(
        name='reduce_op_ignored',
        wraps_gloo=True,
        contract="all_reduce gives every rank the exact reduction of all ranks' inputs (any op)",
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug: the tensor form of reduce_scatter computes AVG as SUM.
    SeededBug(
        name='reduce_scatter_base_avg_as_sum',
        wraps_gloo=True,
        contract='FSDP2 training for several steps equals single-process training on the whole batch',
        clauses=('suites/parallel/test_fsdp.py::test_fsdp2_matches_baseline',),
        suite='suites/parallel/test_fsdp.py',
        shares_a_run=True,
    ),
    # Seeded bug: the older method name of reduce_scatter is a stub that does nothing.
    SeededBug(
        name='reduce_scatter_base_stub',
        wraps_gloo=True,
        contract='both method names of a single-buffer collective reach the backend with the same result',
        clauses=('suites/c10d/test_method_names.py::test_group_method_names_agree',),
        suite='suites/c10d/test_method_names.py',
        shares_a_run=True,
    ),
    # Seeded bug: the coalesced tensor-form reduce_scatter gives each rank its neighbour's chunk.
    SeededBug(
        name='reduce_scatter_coalesced_wrong_chunk',
        wraps_gloo=True,
        contract="funcol reduce_scatter gives rank i the reduction of every rank's chunk i",
        clauses=('suites/parallel/test_functional.py::test_funcol_reduce_scatter',),
        suite='suites/parallel/test_functional.py',
        keyword='reduce_scatter',
        shares_a_run=True,
    ),
    # Seeded bug: reduce_scatter (tensor form) gives each rank its neighbour's chunk.
    SeededBug(
        name='reduce_scatter_wrong_chunk',
        wraps_gloo=True,
        contract="reduce_scatter (tensor form): rank i ends with op over every rank's i-th chunk",
        clauses=('suites/c10d/test_reduce_scatter.py::test_reduce_scatter_tensor',),
        suite='suites/c10d/test_reduce_scatter.py',
        shares_a_run=True,
    ),
    # Seeded bug: reduce always delivers the result to rank 0, whatever ``dst`` says.
    SeededBug(
        name='reduce_to_rank_zero',
        wraps_gloo=True,
        contract='reduce(dst=root) leaves the exact reduction over all ranks at the root, for every root',
        clauses=('suites/c10d/test_broadcast_reduce.py::test_reduce_to_every_root',),
        suite='suites/c10d/test_broadcast_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: a reconfigure to fewer ranks keeps the group it had, excluded ranks included.
    SeededBug(
        name='reference_reconfigure_keeps_excluded',
        contract='reconfigure without the last or a middle rank renumbers the survivors; all_reduce and broadcast exact',
        clauses=('suites/c10d/test_reconfigure.py::test_survivors_are_renumbered',),
        suite='suites/c10d/test_reconfigure.py::test_survivors_are_renumbered',
        hangs=True,
        torch='>=2.14',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: reconfigure() forgets the uuids it used, so a reused uuid is accepted.
    SeededBug(
        name='reference_reused_uuid_accepted',
        contract='reconfigure refuses a uuid used before, no handles, a handle twice, a list without its own handle',
        clauses=('suites/c10d/test_reconfigure.py::test_bad_requests_are_refused',),
        suite='suites/c10d/test_reconfigure.py::test_bad_requests_are_refused',
        torch='>=2.14',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: get_error() says SUCCESS after a timeout, where the reference declares TIMEOUT.
    SeededBug(
        name='reference_get_error_hides_timeout',
        contract='after a timed-out all_reduce get_error() is what the backend declares; a reconfigure recovers',
        clauses=('suites/c10d/test_fault_signals.py::test_after_a_timeout_a_reconfigure_recovers',),
        suite='suites/c10d/test_fault_signals.py',
        torch='>=2.14',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: register_abort_hook() accepts a hook and never calls it.
    SeededBug(
        name='reference_abort_hook_never_called',
        contract='a timed-out all_reduce runs the registered abort hook on the ranks that timed out',
        clauses=('suites/c10d/test_fault_signals.py::test_abort_hooks_run_when_a_timeout_revokes_the_group',),
        suite='suites/c10d/test_fault_signals.py',
        torch='>=2.14',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: a reconfigure after a timeout rebuilds the group it had, the cut-off rank included.
    SeededBug(
        name='reference_shrink_after_timeout_keeps_cut_rank',
        contract='after a partition the reachable ranks reconfigure without the cut rank; all_reduce and broadcast exact',
        clauses=('suites/faults/test_partition_recovery.py::test_the_reachable_ranks_reconfigure_without_the_cut_rank',),
        suite='suites/faults/test_partition_recovery.py',
        keyword='last',  # the one run it needs (each run that catches it waits out a 15 s rendezvous)
        options=('--world-size', '3', '--faults', 'partition'),
        torch='>=2.14',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: a group that grows keeps counting its operations from where it was.
    SeededBug(
        name='reference_grow_keeps_operation_count',
        contract='after healing every rank reconfigures to the whole world; all_reduce and broadcast exact',
        clauses=('suites/faults/test_partition_recovery.py::test_after_healing_the_whole_world_grows_back_by_reconfigure',),
        suite='suites/faults/test_partition_recovery.py',
        keyword='last',
        options=('--world-size', '3', '--faults', 'partition'),
        torch='>=2.14',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: a shrink after a fault keeps every survivor's old number.
    SeededBug(
        name='reference_shrink_after_fault_keeps_numbers',
        contract='without a cut-off middle rank the reachable ranks are renumbered in order; all_reduce and broadcast '
                 'exact',
        clauses=('suites/faults/test_partition_recovery.py::test_the_reachable_ranks_reconfigure_without_the_cut_rank',),
        suite='suites/faults/test_partition_recovery.py',
        keyword='middle',  # the last rank's cases pass on it: its survivors' old numbers are their new ones
        options=('--world-size', '3', '--faults', 'partition'),
        torch='>=2.14',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: abort() fails the running collective but drops the queued ones.
    SeededBug(
        name='reference_abort_drops_queued',
        contract='aborting every group with many operations in flight fails all of them at once',
        clauses=('suites/c10d/test_lifecycle.py::test_abort_under_load_ends_every_pending_work',),
        suite='suites/c10d/test_lifecycle.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: all_reduce_coalesced is not implemented.
    SeededBug(
        name='reference_coalesced_hole',
        contract='every torch.distributed entry point runs on the backend (dist.all_reduce_coalesced)',
        clauses=('suites/c10d/test_entry_points.py::test_entry_point',),
        suite='suites/c10d/test_entry_points.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: p2p between start and end coalescing is left out of the coalesced Work.
    SeededBug(
        name='reference_coalesced_p2p_left_out',
        contract='isend/irecv inside _coalescing_manager(device=...) are part of its Work',
        clauses=('suites/c10d/test_coalescing.py::test_coalescing_manager_with_device_p2p',),
        suite='suites/c10d/test_coalescing.py',
        keyword='test_coalescing_manager_with_device_p2p',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: coalesced all_reduce splits its flat buffer at the wrong seams.
    SeededBug(
        name='reference_coalesced_seams',
        contract='coalesced all_reduce calls each get their own exact reduction',
        clauses=('suites/c10d/test_coalescing.py::test_coalescing_manager_all_reduce',),
        suite='suites/c10d/test_coalescing.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's own flight recorder: collective_seq_id counts each operation by itself.
    SeededBug(
        name='reference_fr_sequence_per_operation',
        contract='each collective leaves one entry per rank with its name, sizes, dtypes, group and an agreed sequence id',
        clauses=('suites/c10d/test_flight_recorder.py::test_collectives_recorded',),
        suite='suites/c10d/test_flight_recorder.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: reduce_scatter accumulates in its output, overwriting its own input.
    SeededBug(
        name='reference_in_place_reads_overwritten',
        contract="reduce_scatter_tensor in place (the output is this rank's chunk of the input) is exact",
        clauses=('suites/c10d/test_memory_safety.py::test_in_place_on_own_chunk',),
        suite='suites/c10d/test_memory_safety.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: all_reduce and send take two process-wide locks in opposite orders.
    SeededBug(
        name='reference_lock_order',
        contract='all_reduce and send/recv on separate groups from two threads at once finish within a deadline',
        clauses=('suites/soak/test_concurrency.py::test_all_reduce_and_p2p_on_separate_groups_at_once',),
        suite='suites/soak/test_concurrency.py::test_all_reduce_and_p2p_on_separate_groups_at_once',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: all_gather loses the last rank's chunk.
    SeededBug(
        name='reference_lost_chunk',
        contract="all_gather into a list: entry i on every rank is rank i's tensor",
        clauses=('suites/c10d/test_gather_scatter.py::test_all_gather_list',),
        suite='suites/c10d/test_gather_scatter.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: ranks are trusted to call the same collective.
    SeededBug(
        name='reference_no_agreement',
        contract='bad input (mismatched shapes/dtypes/collectives) raises on every rank within the deadline',
        clauses=('suites/c10d/test_bad_input.py::test_bad_input_ends_and_is_recorded',),
        suite='suites/c10d/test_bad_input.py',
        shares_a_run=True,
    ),
    # Seeded bug: the reference reports the options of the first group it made, not each group's own.
    SeededBug(
        name='reference_options_cached',
        contract='the pg_options a group was made with are what its backend reports',
        clauses=('suites/c10d/test_shrink_and_options.py::test_pg_options_round_trip',),
        suite='suites/c10d/test_shrink_and_options.py',
        keyword='test_pg_options_round_trip',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: PREMUL_SUM is reduced as a plain SUM (the factor is dropped).
    SeededBug(
        name='reference_premul_as_sum',
        contract="PREMUL_SUM(factor) scales every rank's input by the factor, then sums",
        clauses=('suites/c10d/test_dtypes.py::test_premul_sum',),
        suite='suites/c10d/test_dtypes.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: the worker thread writes results with autograd recording.
    SeededBug(
        name='reference_records_history',
        contract='all_reduce writes data only: a tensor with autograd history keeps its grad_fn and gradient',
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce_leaves_autograd_history_alone',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: two sends to one peer in a row leave in reverse order.
    SeededBug(
        name='reference_sends_reordered',
        contract='messages between one pair of ranks match their irecvs in the order they were sent',
        clauses=('suites/p2p/test_batch_mixed.py::test_batch_all_pairs_mixed_order',),
        suite='suites/p2p/test_batch_mixed.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: shutting a group down leaves its connections open.
    SeededBug(
        name='reference_shutdown_leaks',
        contract='a destroyed group leaves no thread, fd or listening port behind',
        clauses=('suites/c10d/test_lifecycle.py::test_abort_fails_pending_work',),
        suite='suites/c10d/test_lifecycle.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: sparse all_reduce drops the imaginary parts of complex values.
    SeededBug(
        name='reference_sparse_complex_as_real',
        contract="The group's own all_reduce SUM of complex sparse COO tensors adds complex values at equal indices",
        clauses=('suites/c10d/test_dtypes.py::test_sparse_complex_group_all_reduce_sum',),
        suite='suites/c10d/test_dtypes.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: every group starts a thread that never ends.
    SeededBug(
        name='reference_thread_per_group',
        contract='groups created and destroyed from several threads leave no thread behind',
        clauses=('suites/soak/test_churn.py::test_threaded_create_destroy_leaves_nothing',),
        suite='suites/soak/test_churn.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: Work.wait(timeout) ignores its timeout.
    SeededBug(
        name='reference_wait_timeout_ignored',
        contract='Work.wait(timeout) raises on expiry while a member is away',
        clauses=('suites/c10d/test_work.py::test_wait_timeout_raises_on_expiry',),
        suite='suites/c10d/test_work.py',
        hangs=True,
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: every collective writes one element past its output.
    SeededBug(
        name='reference_writes_past_output',
        contract='a collective writes only its outputs: the guard bytes after an output are unchanged',
        clauses=('suites/c10d/test_memory_safety.py::test_guard_regions',),
        suite='suites/c10d/test_memory_safety.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend: MIN and MAX swapped in the reduce-op table.
    SeededBug(
        name='reference_wrong_reduce_op',
        contract="all_reduce gives every rank the exact reduction of all ranks' inputs (any op)",
        clauses=('suites/c10d/test_all_reduce.py::test_all_reduce',),
        suite='suites/c10d/test_all_reduce.py',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's own flight recorder: it records, but never registers where tools read it.
    SeededBug(
        name='reference_fr_never_registered',
        contract="a backend's own flight recorder, as its spec names it, is registered where the harness and tools read it",
        clauses=('suites/c10d/test_flight_recorder.py::test_collectives_recorded',),
        suite='suites/c10d/test_flight_recorder.py',
        keyword='test_collectives_recorded',
        shares_a_run=True,
    ),
    # Seeded bug in the reference backend's p2p: a peer rank outside the group is looked for, not rejected.
    SeededBug(
        name='reference_bad_peer_waits',
        contract="send/recv to a rank that does not exist raises promptly on the caller, well before the group's timeout",
        clauses=('suites/p2p/test_p2p_errors.py::test_bad_peer_raises_promptly',),
        suite='suites/p2p/test_p2p_errors.py',
        shares_a_run=True,
    ),
    # Seeded bug: RemoteModule installs ``forward`` / ``forward_async`` from functions named otherwise.
    SeededBug(
        name='remote_module_forward_unpicklable',
        wraps_gloo=True,
        contract="rm.forward, rm.forward_async and vars(rm) pickle over RPC; the receiver's forward runs the same remote module",
        clauses=('suites/dist_autograd/test_remote_module.py::test_bound_forward_travels_over_rpc',),
        suite='suites/dist_autograd/test_remote_module.py',
        keyword='bound_forward',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference RemoteModule ignores the device of its remote device string.
    SeededBug(
        name='remote_module_ignores_device',
        wraps_gloo=True,
        contract="'w/cpu', 'rank:N/cpu', 'rank:N', 'w' name the worker (name or rank) and device; 'w/cuda:0' parses",
        clauses=('suites/dist_autograd/test_remote_module.py::test_remote_device_valid_forms',),
        suite='suites/dist_autograd/test_remote_module.py',
        keyword='remote_device',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference callee runs a builtin's name as the first callable torch's table lists under it.
    SeededBug(
        name='rpc_builtin_resolves_math',
        wraps_gloo=True,
        contract='A torch builtin runs as its aten operator: torch.cos of a one-element tensor returns a tensor, math.cos a float',
        clauses=('suites/rpc/test_fidelity.py::test_builtins_run_the_torch_operator',),
        suite='suites/rpc/test_fidelity.py',
        keyword='builtins',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference caller sends a builtin call whose arguments no schema of the operator takes.
    SeededBug(
        name='rpc_builtin_unmatched_sent',
        wraps_gloo=True,
        contract='A torch builtin runs as its aten operator: torch.cos of a one-element tensor returns a tensor, math.cos a float',
        clauses=('suites/rpc/test_fidelity.py::test_builtins_run_the_torch_operator',),
        suite='suites/rpc/test_fidelity.py',
        keyword='builtins',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the TensorPipe agent is started without the device maps its accelerator ranks need.
    # Not seen failing here (no GPU): the clause docs/rpc.md measured failing on an H200
    SeededBug(
        name='rpc_device_map_dropped',
        contract="An accelerator tensor reaches the callee on the device the map names; its reply returns on the caller's device",
        clauses=('suites/rpc/test_device_maps.py::test_tensor_crosses_onto_the_mapped_device_and_back',),
        suite='suites/rpc/test_device_maps.py',
        options=('--rpc-agent', 'tensorpipe',),
        needs=("cuda",),
        shares_a_run=False,
    ),
    # Seeded bug: the reference receiver ignores the sender's device map and delivers device tensors on the host.
    SeededBug(
        name='rpc_device_map_ignored',
        builds=('native', 'dcdev'),
        contract="An accelerator tensor reaches the callee on the device the map names; its reply returns on the caller's device",
        clauses=('suites/rpc/test_device_maps.py::test_tensor_crosses_onto_the_mapped_device_and_back',),
        suite='suites/rpc/test_device_maps.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=False,  # registers the dcdev device in every process of its run
    ),
    # Seeded bug: the reference sender moves a device tensor to the host when its destination has no device map.
    SeededBug(
        name='rpc_unmapped_device_to_host',
        builds=('native', 'dcdev'),
        contract='Without a device map for the destination an accelerator tensor is refused with an error naming devices',
        clauses=('suites/rpc/test_device_maps.py::test_unmapped_destination_refuses_accelerator_tensors',),
        suite='suites/rpc/test_device_maps.py',
        keyword='unmapped',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=False,  # registers the dcdev device in every process of its run
    ),
    # Seeded bug: the reference caller re-raises a remote error's text without torch's unicode_escape decoding.
    SeededBug(
        name='rpc_error_text_escaped',
        wraps_gloo=True,
        contract="A re-raised remote error's text is unicode_escape-decoded as torch does: repr's \\n is a line break",
        clauses=('suites/rpc/test_fidelity.py::test_remote_error_text_is_decoded_as_torch_decodes_it',),
        suite='suites/rpc/test_fidelity.py',
        keyword='decoded',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference RPC agent swallows a remote function's exception and answers None.
    SeededBug(
        name='rpc_exception_swallowed',
        wraps_gloo=True,
        contract="A remote function's exception is re-raised on the caller with its type and message",
        clauses=('suites/rpc/test_errors.py::test_remote_exception_keeps_type_and_message',),
        suite='suites/rpc/test_errors.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference RPC agent loses a call's own timeout and waits the agent's default instead.
    SeededBug(
        name='rpc_lost_timeout',
        wraps_gloo=True,
        contract="A call (or to_here) whose callee computes longer than timeout= fails with the agent's timeout error",
        clauses=('suites/rpc/test_timeouts.py::test_slow_callee_times_out',),
        suite='suites/rpc/test_timeouts.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference RPC pickler sends an nn.Parameter as a plain tensor.
    SeededBug(
        name='rpc_parameter_as_tensor',
        wraps_gloo=True,
        contract='An nn.Parameter arrives as an nn.Parameter (requires_grad kept, a leaf), sent or inside a returned module',
        clauses=('suites/rpc/test_fidelity.py::test_parameter_keeps_its_class',),
        suite='suites/rpc/test_fidelity.py',
        keyword='parameter',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=False,
    ),
    # Seeded bug: reference-pg completes futures on its only listener thread and never hands receiving on.
    SeededBug(
        name='rpc_pg_callback_blocks_listener',
        wraps_gloo=True,
        contract='A then() callback that waits on another RPC to the same peer completes (tensor([3., 3.])), no deadlock',
        clauses=('suites/rpc/test_futures.py::test_then_callback_may_wait_on_another_rpc',),
        suite='suites/rpc/test_futures.py',
        options=('--rpc-agent', 'reference-pg',),
        shares_a_run=True,
    ),
    # Seeded bug: the callee answers with the events recorded when the function returned, missing async work.
    SeededBug(
        name='rpc_profiling_async_missed',
        wraps_gloo=True,
        contract="the callee's events are collected when the response is complete (async_execution work included)",
        clauses=('suites/profiling/test_parity.py::test_nested_async_events_match_tensorpipe',),
        suite='suites/profiling/',
        options=('--rpc-agent', 'reference-tp', '--world-size', '3',),
        shares_a_run=True,
    ),
    # Seeded bug: a profiled Python function that raises answers with its error but without its events.
    SeededBug(
        name='rpc_profiling_error_events_dropped',
        wraps_gloo=True,
        contract="a profiled Python function that raises brings its error and the callee's events back (TensorPipe parity)",
        clauses=('suites/profiling/test_parity.py::test_events_match_tensorpipe',),
        suite='suites/profiling/',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: remote events lose the callee's node id and show the caller's.
    SeededBug(
        name='rpc_profiling_lost_node_id',
        wraps_gloo=True,
        contract='remote events keep the node id (rank) of the worker that ran them',
        clauses=('suites/profiling/test_parity.py::test_events_match_tensorpipe',),
        suite='suites/profiling/',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the callee ignores record_shapes from the envelope, so remote ops have no input shapes.
    SeededBug(
        name='rpc_profiling_shapes_dropped',
        wraps_gloo=True,
        contract="with record_shapes a remote op's input shapes equal the same op profiled locally",
        clauses=('suites/profiling/test_parity.py::test_events_match_tensorpipe',),
        suite='suites/profiling/',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the RPC's profiling key drops the spaces around "->" ("rpc_sync#aten::add(worker0->worker1)").
    SeededBug(
        name='rpc_profiling_wrong_key',
        wraps_gloo=True,
        contract='the RPC event is named rpc_{mode}#{name}({src} -> {dst}), remote events key#remote_op: op',
        clauses=('suites/profiling/test_parity.py::test_events_match_tensorpipe',),
        suite='suites/profiling/',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: the reference RPC agent sends each reply to the worker whose request arrived last.
    SeededBug(
        name='rpc_reply_wrong_caller',
        wraps_gloo=True,
        contract='A worker calling itself by its own name runs the function locally and gets the result; many calls in flight from every worker to every worker: each reply comes from the callee asked',
        clauses=('suites/rpc/test_calls.py::test_call_to_self',
                 'suites/rpc/test_calls.py::test_concurrent_calls_each_get_their_own_reply'),
        suite='suites/rpc/test_calls.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: graceful shutdown gives up on late workers after the RPC timeout.
    SeededBug(
        name='rpc_shutdown_inherits_rpc_timeout',
        wraps_gloo=True,
        contract="Graceful shutdown waits for a worker that reaches it 3 RPC timeouts later; every worker's returns",
        clauses=('suites/rpc/test_shutdown.py::test_graceful_shutdown_waits_for_a_late_worker_beyond_the_rpc_timeout',),
        suite='suites/rpc/test_shutdown.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: graceful shutdown ignores the timeout it was given and waits for the other workers without bound.
    SeededBug(
        name='rpc_shutdown_ignores_its_timeout',
        wraps_gloo=True,
        contract="Under a partition, with a call in flight across it, shutdown(graceful=True, timeout=2) ends within 2 s + slack",
        clauses=('suites/faults/test_rpc_faults.py::test_graceful_shutdown_ends_within_its_timeout',),
        suite='suites/faults/test_rpc_faults.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: reference-pg's close waits its own 10 s for the peers' STOP frames, whatever the shutdown's timeout.
    SeededBug(
        name='rpc_pg_close_ignores_the_shutdown_timeout',
        wraps_gloo=True,
        contract="Under a partition, with a call in flight across it, shutdown(graceful=True, timeout=2) ends within 2 s + slack",
        clauses=('suites/faults/test_rpc_faults.py::test_graceful_shutdown_ends_within_its_timeout',),
        suite='suites/faults/test_rpc_faults.py',
        options=('--rpc-agent', 'reference-pg',),
        shares_a_run=True,
    ),
    # Seeded bug: reference-pg's transport waits a fixed minute for its peers to announce themselves.
    SeededBug(
        name='rpc_pg_start_waits_a_minute',
        wraps_gloo=True,
        contract="With a peer frozen before init_rpc, init_rpc and the first call end within the agent's RPC timeout + slack",
        clauses=('suites/faults/test_rpc_faults.py::test_connecting_ends_within_the_agent_timeout',),
        suite='suites/faults/test_rpc_faults.py',
        keyword='connecting',
        options=('--rpc-agent', 'reference-pg', '--faults', 'frozen'),
        shares_a_run=True,
    ),
    # Seeded bug: the reference-tp agent connects with a fixed minute instead of the agent's RPC timeout.
    SeededBug(
        name='rpc_connect_ignores_its_timeout',
        wraps_gloo=True,
        contract="With a partition in place before init_rpc, init_rpc and the first call end within the agent's RPC timeout + slack",
        clauses=('suites/faults/test_rpc_faults.py::test_connecting_ends_within_the_agent_timeout',),
        suite='suites/faults/test_rpc_faults.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: graceful shutdown trusts the store to bound its own waits (the control plane cut off).
    SeededBug(
        name='rpc_store_shutdown_unbounded',
        wraps_gloo=True,
        contract="With the store cut off from a worker's host, shutdown(graceful=True, timeout=2) ends within 2 s + slack",
        clauses=('suites/faults/test_rpc_faults.py::test_graceful_shutdown_ends_within_its_timeout',),
        suite='suites/faults/test_rpc_faults.py::test_graceful_shutdown_ends_within_its_timeout',
        options=('--rpc-agent', 'reference-tp', '--faults', 'control_plane'),
        shares_a_run=True,
    ),
    # Seeded bug: the agent's rendezvous runs under c10d's default 30 minutes, not the agent's timeout.
    SeededBug(
        name='rpc_rendezvous_without_its_timeout',
        wraps_gloo=True,
        contract="With the store cut off before init_rpc, init_rpc ends within the agent's RPC timeout + slack",
        clauses=('suites/faults/test_rpc_faults.py::test_connecting_ends_within_the_agent_timeout',),
        suite='suites/faults/test_rpc_faults.py::test_connecting_ends_within_the_agent_timeout',
        options=('--rpc-agent', 'reference-tp', '--faults', 'control_plane'),
        shares_a_run=True,
    ),
    # Seeded bug: reference-pg makes its group under the listener's days-long timeout, unbounded.
    SeededBug(
        name='rpc_pg_connect_unbounded',
        wraps_gloo=True,
        contract="With the network partitioned before init_rpc, init_rpc ends within the agent's RPC timeout + slack",
        clauses=('suites/faults/test_rpc_faults.py::test_connecting_ends_within_the_agent_timeout',),
        suite='suites/faults/test_rpc_faults.py::test_connecting_ends_within_the_agent_timeout',
        options=('--rpc-agent', 'reference-pg', '--faults', 'partition'),
        shares_a_run=True,
    ),
    # Seeded bug: every call looks its destination up in the store again.
    SeededBug(
        name='rpc_calls_read_the_store',
        wraps_gloo=True,
        contract="With only the store cut off, every call between started agents succeeds, exact, within its timeout",
        clauses=('suites/faults/test_rpc_faults.py::test_a_store_cut_off_never_breaks_a_call_between_started_agents',),
        suite='suites/faults/test_rpc_faults.py::test_a_store_cut_off_never_breaks_a_call_between_started_agents',
        options=('--rpc-agent', 'reference-tp', '--faults', 'control_plane'),
        shares_a_run=True,
    ),
    # Seeded bug: reference-tp sends every tensor row-major, so a transpose arrives contiguous.
    SeededBug(
        name='rpc_strides_lost',
        wraps_gloo=True,
        contract='A transposed, permuted, channels_last or expanded tensor arrives with its strides, as argument and as result',
        clauses=('suites/rpc/test_fidelity.py::test_strides_survive_rpc',),
        suite='suites/rpc/test_fidelity.py',
        keyword='strides',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: a user that receives an RRef forked by another user never asks the owner to confirm it.
    SeededBug(
        name='rref_fork_never_confirmed',
        wraps_gloo=True,
        contract='A function receiving a user RRef forked by another user sees confirmed_by_owner() True (the owner confirmed first)',
        clauses=('suites/rpc/test_fidelity_more.py::test_forked_user_rref_is_confirmed_inside_the_callee',),
        suite='suites/rpc/test_fidelity_more.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: an RRef's owner answers local_value() only once remote() has built the value, and refuses before.
    SeededBug(
        name='rref_owner_refuses_unbuilt',
        wraps_gloo=True,
        contract='An RRef sent to its owner while remote() still builds the value works there, even in a call to self',
        clauses=('suites/rpc/test_rrefs.py::test_rref_reaches_owner_before_its_value',),
        suite='suites/rpc/test_rrefs.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: ``rref.remote().method()`` sends the call without checking the owner's value type first.
    SeededBug(
        name='rref_remote_proxy_unchecked',
        wraps_gloo=True,
        contract="rref.remote().missing_method() raises AttributeError at the call (the owner's value type is checked first)",
        clauses=('suites/rpc/test_fidelity_more.py::test_remote_proxy_of_a_missing_method_raises_at_the_call',),
        suite='suites/rpc/test_fidelity_more.py',
        options=('--rpc-agent', 'reference-tp',),
        shares_a_run=True,
    ),
    # Seeded bug: scatter hands out the root's list in reverse order.
    SeededBug(
        name='scatter_ignores_root_order',
        wraps_gloo=True,
        contract="scatter(src=root): rank i receives entry i of the root's list",
        clauses=('suites/c10d/test_gather_scatter.py::test_scatter_from_every_root',),
        suite='suites/c10d/test_gather_scatter.py',
        shares_a_run=True,
    ),
    # Seeded bug: set_timeout is kept by the group but never reaches the backend.
    SeededBug(
        name='set_timeout_dropped',
        wraps_gloo=True,
        contract='the timeout a group is given is the timeout its backend reports',
        clauses=('suites/c10d/test_capabilities.py::test_group_options_round_trip',),
        suite='suites/c10d/test_capabilities.py',
        shares_a_run=True,
    ),
    # Seeded bug: all_reduce AVG on a subgroup divides by the world size, not the group size.
    SeededBug(
        name='subgroup_avg_by_world_size',
        wraps_gloo=True,
        contract="Each mesh dimension's group holds exactly the ranks sharing the other coordinates; all_reduce over it sums (and averages) them",
        clauses=('suites/parallel/test_dtensor.py::test_device_mesh_dims',),
        suite='suites/parallel/test_dtensor.py',
        keyword='device_mesh',
        options=('--world-size', '4',),
        shares_a_run=True,
    ),
    # Seeded bug: a subgroup's broadcast translates its root from global to group rank a second time.
    SeededBug(
        name='subgroup_root_translated_twice',
        wraps_gloo=True,
        contract='broadcast on a subgroup takes src as a global rank and reaches only the members',
        clauses=('suites/c10d/test_subgroups.py::test_subgroup_broadcast_global_root',),
        suite='suites/c10d/test_subgroups.py',
        options=('--world-size', '3',),
        shares_a_run=True,
    ),
    # Seeded bug: the backend caps every timeout at its own short one; a group asking for longer times out early.
    SeededBug(
        name='timeout_capped',
        wraps_gloo=True,
        contract="a rank that comes late but well within the group's timeout does not make the others time out",
        clauses=('suites/c10d/test_timeouts.py::test_late_rank_within_group_timeout_succeeds',),
        suite='suites/c10d/test_timeouts.py::test_late_rank_within_group_timeout_succeeds',
        shares_a_run=True,
    ),
    # Seeded bug: the group's timeout is ignored; a collective a peer skips blocks forever.
    SeededBug(
        name='timeout_ignored',
        wraps_gloo=True,
        contract="a collective one rank skips raises within the group's timeout",
        clauses=('suites/c10d/test_timeouts.py::test_skipped_collective_raises_within_group_timeout',),
        suite='suites/c10d/test_timeouts.py',
        hangs=True,
        shares_a_run=True,
    ),
    # Seeded bug: uint8 data moved by broadcast, all_gather, gather and scatter saturates at 127.
    SeededBug(
        name='uint8_saturates_at_127',
        wraps_gloo=True,
        contract='all_gather_object / broadcast_object_list / gather_object / scatter_object_list return equal objects',
        clauses=('suites/c10d/test_objects.py::test_all_gather_object',),
        suite='suites/c10d/test_objects.py',
        shares_a_run=True,
    ),
)
