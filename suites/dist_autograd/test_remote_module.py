"""Contract: RemoteModule runs a module on the worker its remote device names, and trains through RPC.

``RemoteModule(remote_device, module_cls, args, kwargs)`` builds the module
on that worker; ``forward`` and ``forward_async`` give what the module gives
locally (args, kwargs and tuples included); ``remote_parameters()`` are RRefs
owned by that worker; ``get_module_rref()`` points to the module; training
through ``remote_parameters()`` + DistributedOptimizer equals local training.
The remote device string is parsed as torch parses it: "worker1/cpu",
"rank:1/cpu", "worker1" (cpu), "worker1/cuda:0" (parses without a GPU, fails
at first use); a bad string raises torch's ValueError text, a bad device
torch.device's RuntimeError, an unknown worker the agent's lookup error, a
module class that builds no nn.Module torch's ValueError at first use. Local
nn.Module methods refuse with torch's texts; a RemoteModule pickles only
inside an RPC, and one passed to another worker runs the same module there,
as do its bound ``forward`` / ``forward_async`` and ``vars(rm)``
(spec ../shared/specs/dist-autograd.md E; torch's remote_module_test).
"""

import pickle
import re

import pytest
import torch

from backends.rpc_agents import worker_name
from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.dist_autograd import training
from suites.rpc import udfs
from suites.rpc.common import callee_log, outcome_of, peer, peer_name

PARSE_ERROR = ("Could not parse remote_device: {}. The valid format is '<workername>/<device>' or "
               "'rank:<rank>/<device>' or '<device>'")
BAD_STRINGS = ("/cpu", "/", "/cuda:0", "worker1/cpu/extra", "worker1/cuda:0/cuda:1", "rank:x/cpu", "rank:-1/cpu",
               "a:b/cpu", "a:b:c/cpu")
# torch.device's own errors pass through (regexes: torch may list more device types or add a backtrace)
BAD_DEVICES = {"worker1/badtype": r"^Expected one of cpu, cuda, .* device type at start of device string: badtype",
               "worker1/": r"^Device string must not be empty",
               "worker1/cpu2": r"^Invalid device string: 'cpu2'"}
UNSUPPORTED = ("register_buffer", "register_parameter", "add_module", "apply", "cuda", "cpu", "type", "float",
               "double", "half", "bfloat16", "to", "register_backward_hook", "register_forward_pre_hook",
               "register_forward_hook", "state_dict", "load_state_dict", "named_parameters", "buffers",
               "named_buffers", "children", "named_children", "modules", "named_modules", "requires_grad_",
               "zero_grad", "share_memory", "extra_repr")
CALL_ARGS = {"register_buffer": ("b", None), "register_parameter": ("p", None), "add_module": ("m", None),
             "apply": (print,), "type": (torch.float32,), "to": ("cpu",), "register_backward_hook": (print,),
             "register_forward_pre_hook": (print,), "register_forward_hook": (print,), "load_state_dict": ({},)}
STEPS = 3


def x_for(rank: int) -> torch.Tensor:
    return torch.arange(8, dtype=torch.float32).reshape(2, 4) / (rank + 1)


# ---------------------------------------------------------------- rank side
def forward_both_ways():
    rm = training.nn_module().RemoteModule(f"{peer_name()}/cpu", training.Seeded, args=(ctx.rank,))
    x = x_for(ctx.rank)
    fut = rm.forward_async(x)
    local = training.Seeded(ctx.rank)
    with torch.no_grad():
        want = local(x)
    return rm.forward(x).detach(), fut.wait().detach(), want, type(fut).__name__


def forward_with_args_and_kwargs():
    rm = training.nn_module().RemoteModule(f"{peer_name()}/cpu", training.ReturnsArgs, kwargs={"first": 2})
    t = torch.ones(2)
    return rm.forward(t, 7, word="kw"), rm.forward_async(t, 8).wait()


def parameters_and_module_rref():
    rm = training.nn_module().RemoteModule(peer_name(), training.Seeded, args=(ctx.rank,))
    params = rm.remote_parameters()
    local = [p.detach() for p in training.Seeded(ctx.rank).parameters()]
    module_rref = rm.get_module_rref()
    lives = lifecycle.rpc().rpc_sync(peer_name(), training.where_module_lives, (module_rref,))
    return ([(p.owner().name, p.to_here().detach()) for p in params], local, module_rref is rm.get_module_rref(),
            module_rref.owner().name, lives)


def train_through_remote_parameters(optimizer: str, use_async: bool = False):
    s = training.stack()
    cls, kwargs = training.OPTIMIZERS[optimizer]
    rm = s.nn.RemoteModule(f"{peer_name()}/cpu", training.Seeded, args=(ctx.rank,))
    dist_optim = s.optim.DistributedOptimizer(cls, rm.remote_parameters(), **kwargs)
    local = training.Seeded(ctx.rank)
    local_optim = cls(local.parameters(), **kwargs)
    for x, _target in training.batches(ctx.rank, STEPS):  # the loss pulls towards ones, not the target
        with s.autograd.context() as context_id:
            out = rm.forward_async(x).wait() if use_async else rm.forward(x)
            loss = ((out - torch.ones(5, 3)) ** 2).mean()
            s.autograd.backward(context_id, [loss])
            dist_optim.step(context_id)
        local_optim.zero_grad()
        ((local(x) - torch.ones(5, 3)) ** 2).mean().backward()
        local_optim.step()
    return [p.to_here().detach() for p in rm.remote_parameters()], [p.detach() for p in local.parameters()]


def parse_valid():
    """(on, device, forward works) for each valid form, against the peer."""
    make = training.nn_module().RemoteModule
    got = {}
    for spec in (f"{peer_name()}/cpu", f"rank:{peer()}/cpu", f"rank:{peer()}", peer_name(), f"{peer_name()}/cuda:0"):
        rm = make(spec, training.Seeded, args=(0,))
        got[spec] = (rm.on, rm.device, outcome_of(rm.forward, torch.ones(1, 4)))
    return got


def parse_invalid():
    make = training.nn_module().RemoteModule
    bad = {spec: outcome_of(make, spec, training.Seeded, args=(0,)) for spec in BAD_STRINGS + tuple(BAD_DEVICES)}
    bad["int"] = outcome_of(make, 1, training.Seeded, args=(0,))
    return bad


def unknown_workers():
    make = training.nn_module().RemoteModule
    return {spec: outcome_of(lambda: make(spec, training.Seeded, args=(0,)).forward(torch.ones(1, 4)))
            for spec in ("worker99/cpu", "rank:99/cpu")}


def bad_module_class():
    rm = training.nn_module().RemoteModule(f"{peer_name()}/cpu", training.NotAModule)
    return outcome_of(rm.forward, torch.ones(1))


def unsupported_methods():
    rm = training.nn_module().RemoteModule(f"{peer_name()}/cpu", training.Seeded, args=(0,))
    got = {name: outcome_of(getattr(rm, name), *CALL_ARGS.get(name, ())) for name in UNSUPPORTED}
    got["parameters"] = outcome_of(rm.parameters)
    got["pickle"] = outcome_of(pickle.dumps, rm)
    return got


def train_eval_remote():
    rm = training.nn_module().RemoteModule(f"{peer_name()}/cpu", training.Seeded, args=(0,))
    rpc = lifecycle.rpc()
    flags = [rpc.rpc_sync(peer_name(), training.where_module_lives, (rm.get_module_rref(),))[1]]
    rm.eval()
    flags.append(rpc.rpc_sync(peer_name(), training.where_module_lives, (rm.get_module_rref(),))[1])
    rm.train()
    flags.append(rpc.rpc_sync(peer_name(), training.where_module_lives, (rm.get_module_rref(),))[1])
    return flags


def sent_to_third_worker():
    rpc = lifecycle.rpc()
    rm = training.nn_module().RemoteModule(f"{peer_name(1)}/cpu", training.Seeded, args=(ctx.rank,))
    x = x_for(ctx.rank)
    there, keys = rpc.rpc_sync(peer_name(2), training.forward_remote_module, (rm, x))
    return there.detach(), rm.forward(x).detach(), keys


def extra_attribute_not_sent():
    rm = training.nn_module().RemoteModule(f"{peer_name()}/cpu", training.Seeded, args=(0,))
    rm.new_attr = 1  # neither sent nor declared as deliberately kept back
    # The module must exist before it goes back to its owner: TensorPipe loses the owner's call to itself
    # otherwise (agent gap rref_to_owner_before_created, checked by suites/rpc/test_rrefs.py on its own).
    rm.get_module_rref().to_here()
    with callee_log() as log:
        _, keys = lifecycle.rpc().rpc_sync(peer_name(), training.forward_remote_module, (rm, torch.ones(1, 4)))
    return keys, "".join(log)


def bound_methods_sent():
    rpc = lifecycle.rpc()
    rm = training.nn_module().RemoteModule(f"{peer_name()}/cpu", training.Seeded, args=(ctx.rank,))
    rm.get_module_rref().to_here()  # the module exists before its owner calls it (agent gap rref_to_owner_before_created)
    x = x_for(ctx.rank)
    sent = {"forward": outcome_of(rpc.rpc_sync, peer_name(), udfs.call_with, (rm.forward, x)),
            "forward_async": outcome_of(rpc.rpc_sync, peer_name(), udfs.call_and_wait, (rm.forward_async, x)),
            "vars": outcome_of(rpc.rpc_sync, peer_name(), udfs.sorted_keys, (vars(rm),))}
    for name in ("forward", "forward_async"):
        if not sent[name].raised:
            sent[name].value = sent[name].value.detach()  # the harness pickles results: no autograd history
    return sent, rm.forward(x).detach(), sorted(vars(rm))


def shared_by_module_rref():
    nn_mod = training.nn_module()
    rm = nn_mod.RemoteModule(f"{peer_name()}/cpu", training.Seeded, args=(ctx.rank,))
    other = nn_mod.RemoteModule.init_from_module_rref(f"{peer_name()}/cpu", rm.get_module_rref())
    x = x_for(ctx.rank)
    return rm.forward(x).detach(), other.forward(x).detach(), other.get_module_rref() is rm.get_module_rref()


# ---------------------------------------------------------------- clauses
def test_forward_and_forward_async_equal_local_module(rpc_agent):
    """forward(x) and forward_async(x).wait() equal the same module run locally; forward_async gives a Future."""
    for rank, (sync, fut, want, fut_type) in enumerate(rpc_agent.run(forward_both_ways)):
        torch.testing.assert_close(sync, want, msg=lambda m: f"rank {rank}: forward: {m}")
        torch.testing.assert_close(fut, want, msg=lambda m: f"rank {rank}: forward_async: {m}")
        assert fut_type == "Future", f"rank {rank}: forward_async returned a {fut_type}"


def test_forward_passes_args_and_kwargs(rpc_agent):
    """forward(t, 7, word='kw') reaches the module's forward as given, and its tuple comes back."""
    for rank, (with_kw, without) in enumerate(rpc_agent.run(forward_with_args_and_kwargs)):
        assert with_kw[:2] == ("kw", 7) and torch.equal(with_kw[2], torch.full((2,), 3.0)), \
            f"rank {rank}: forward(t, 7, word='kw') gave {with_kw}"
        assert without[:2] == ("default", 8), f"rank {rank}: forward_async(t, 8) gave {without}"


def test_remote_parameters_and_module_rref(rpc_agent):
    """remote_parameters() are RRefs owned by the module's worker, equal to the module's parameters."""
    n = rpc_agent.world_size
    for rank, (params, local, same, owner, (lives, _)) in enumerate(rpc_agent.run(parameters_and_module_rref)):
        where = worker_name((rank + 1) % n)
        assert [o for o, _ in params] == [where] * len(local), f"rank {rank}: parameter owners {params}"
        for (_, got), want in zip(params, local):
            torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank}: remote parameter: {m}")
        assert same and owner == where and lives == where, \
            f"rank {rank}: get_module_rref same object {same}, owner {owner}, module on {lives}; expected {where}"


@pytest.mark.parametrize("optimizer,use_async", [("SGD", False), ("PlainAdam", False), ("SGD", True)],
                         ids=["SGD-forward", "PlainAdam-forward", "SGD-forward_async"])
def test_training_through_remote_parameters_equals_local(rpc_agent, optimizer, use_async):
    """forward (or forward_async) + dist backward + DistributedOptimizer(remote_parameters()) equals local training."""
    for rank, (got, want) in enumerate(rpc_agent.run(train_through_remote_parameters, optimizer, use_async)):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, msg=lambda m: f"rank {rank}, {optimizer}: {m}")


# What torch says when a module is moved to CUDA where there is none: a CPU build says it has no
# CUDA; a CUDA build (the registry's default wheel) on a machine without a GPU says what is missing.
NO_CUDA_ERRORS = (("Torch not compiled with CUDA enabled",) if torch.version.cuda is None else
                  ("Found no NVIDIA driver on your system", "No CUDA GPUs are available"))


def test_remote_device_valid_forms(rpc_agent):
    """'w/cpu', 'rank:N/cpu', 'rank:N', 'w' name the worker (name or rank) and device; 'w/cuda:0' parses."""
    for rank, got in enumerate(rpc_agent.run(parse_valid)):
        p = (rank + 1) % rpc_agent.world_size
        name = worker_name(p)
        want = {f"{name}/cpu": (name, "cpu"), f"rank:{p}/cpu": (p, "cpu"), f"rank:{p}": (p, "cpu"),
                name: (name, "cpu"), f"{name}/cuda:0": (name, "cuda:0")}
        for spec, (on, device) in want.items():
            got_on, got_device, forward = got[spec]
            assert (got_on, got_device) == (on, device), f"rank {rank}: {spec!r} parsed as on={got_on!r}, " \
                f"device={got_device!r}; expected {on!r}, {device!r}"
            if device == "cpu":
                assert not forward.raised, f"rank {rank}: forward on {spec!r} {forward.describe()}"
            elif not torch.cuda.is_available():  # no usable GPU: the module cannot be placed, first use says why
                assert forward.raised and any(why in forward.error for why in NO_CUDA_ERRORS), \
                    f"rank {rank}: forward on {spec!r} without CUDA {forward.describe()}"


def test_remote_device_invalid_strings(rpc_agent):
    """Bad remote_device strings raise torch's ValueError, bad devices torch.device's error, an int a TypeError."""
    for rank, bad in enumerate(rpc_agent.run(parse_invalid)):
        for spec in BAD_STRINGS:
            got = bad[spec]
            assert (got.error_type, got.error) == ("ValueError", PARSE_ERROR.format(spec)), \
                f"rank {rank}: RemoteModule({spec!r}) {got.describe()}"
        for spec, pattern in BAD_DEVICES.items():
            got = bad[spec]
            assert got.error_type == "RuntimeError" and re.search(pattern, got.error), \
                f"rank {rank}: RemoteModule({spec!r}) {got.describe()}; expected RuntimeError matching {pattern!r}"
        got = bad["int"]
        assert (got.error_type, got.error) == ("TypeError", "Invalid type for remote_device: <class 'int'>"), \
            f"rank {rank}: RemoteModule(1) {got.describe()}"


def test_unknown_worker_raises(rpc_agent):
    """'worker99/cpu' and 'rank:99/cpu' raise the agent's 'could not find destination' error."""
    for rank, got in enumerate(rpc_agent.run(unknown_workers)):
        name = worker_name(rank)
        for spec, tail in (("worker99/cpu", "could not find destination name worker99"),
                           ("rank:99/cpu", "could not find destination id 99")):
            assert got[spec].raised and f"name:{name},rank:{rank} {tail}" in got[spec].error, \
                f"rank {rank}: {spec!r} {got[spec].describe()}"


def test_module_class_not_a_module(rpc_agent):
    """A module_cls that builds no nn.Module fails at first use with torch's 'Expect `module_cls(...)`' text."""
    for rank, got in enumerate(rpc_agent.run(bad_module_class)):
        want = "Expect `module_cls(*args, **kwargs)` returns an instance of <class nn.Module>, but it returns an " \
               "instance of <class 'suites.dist_autograd.training.NotAModule'>."
        assert got.error_type == "ValueError" and want in got.error, f"rank {rank}: forward {got.describe()}"


def test_local_module_methods_refuse(rpc_agent):
    """nn.Module methods that would act on a local copy raise torch's ValueError; pickling outside RPC refuses."""
    for rank, got in enumerate(rpc_agent.run(unsupported_methods)):
        for name in UNSUPPORTED:
            assert (got[name].error_type, got[name].error) == \
                ("ValueError", f"Method ``{name}`` not supported for RemoteModule"), \
                f"rank {rank}: {name}() {got[name].describe()}"
        assert got["parameters"].error == "Method ``parameters`` not supported for RemoteModule. Please use " \
            "``remote_parameters`` instead.", f"rank {rank}: parameters() {got['parameters'].describe()}"
        assert got["pickle"].error_type == "RuntimeError" and got["pickle"].error.startswith(
            "Cannot pickle RemoteModule in python pickler. RemoteModule can only be pickled when using RPC"), \
            f"rank {rank}: pickle.dumps {got['pickle'].describe()}"


def test_train_and_eval_reach_the_remote_module(rpc_agent):
    """eval() and train() switch the training flag of the module on its worker."""
    for rank, flags in enumerate(rpc_agent.run(train_eval_remote)):
        assert flags == [True, False, True], f"rank {rank}: remote training flag went {flags}"


@pytest.mark.min_world_size(3)
def test_remote_module_sent_to_third_worker(rpc_agent):
    """A RemoteModule passed over RPC runs the same module from the receiver; only torch's 6 attributes travel."""
    for rank, (there, here, keys) in enumerate(rpc_agent.run(sent_to_third_worker)):
        torch.testing.assert_close(there, here, msg=lambda m: f"rank {rank}: forward from the third worker: {m}")
        assert keys == ["device", "forward", "forward_async", "generated_methods", "is_device_map_set",
                        "is_scriptable", "module_rref", "on"], f"rank {rank}: the receiver's attributes {keys}"


def test_new_attribute_is_not_sent(rpc_agent):
    """An attribute set on a RemoteModule does not travel over RPC; the sender says so on stderr (torch's text)."""
    for rank, (keys, log) in enumerate(rpc_agent.run(extra_attribute_not_sent)):
        assert "new_attr" not in keys, f"rank {rank}: the receiver got {keys}"
        assert "The new attribute ``new_attr`` of RemoteModule is ignored during RPC pickling." in log, \
            f"rank {rank}: the sender's stderr: {log[-500:]!r}"


def test_bound_forward_travels_over_rpc(rpc_agent):
    """rm.forward, rm.forward_async and vars(rm) pickle over RPC; the receiver's forward runs the same remote module."""
    for rank, (sent, here, keys) in enumerate(rpc_agent.run(bound_methods_sent)):
        for name in ("forward", "forward_async"):
            got = sent[name]
            assert not got.raised, f"rank {rank}: sending rm.{name} over RPC {got.describe()}"
            torch.testing.assert_close(got.value, here,
                                       msg=lambda m: f"rank {rank}: rm.{name} called by the receiver: {m}")
        assert not sent["vars"].raised and sent["vars"].value == keys, \
            f"rank {rank}: sending vars(rm) {sent['vars'].describe()}; its keys are {keys}"


def test_init_from_module_rref_shares_the_module(rpc_agent):
    """RemoteModule.init_from_module_rref over get_module_rref() runs the same module (same output, same RRef)."""
    for rank, (first, second, same) in enumerate(rpc_agent.run(shared_by_module_rref)):
        torch.testing.assert_close(second, first, msg=lambda m: f"rank {rank}: {m}")
        assert same, f"rank {rank}: the second RemoteModule holds another RRef"
