"""The training stack's remote side and its single-process twins: parameters on workers, models, optimizers.

Every function a clause calls remotely lives here (a callee unpickles a
function by module and name). Anything that needs the agent's API goes
through ``stack()``: the rpc / autograd / optim / nn modules of whichever
agent this rank runs (backends/rpc_agents.py), so one helper serves every
agent. The expected values of the clauses are the same computation run
locally in one process (``local_training``), never the implementation
under test.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import nn, optim
from torch.distributed.rpc.functions import async_execution

from backends import rpc_agents
from fixtures import rpc_lifecycle as lifecycle
from fixtures.rank import ctx
from suites.rpc.common import barrier


@dataclass(frozen=True)
class Stack:
    rpc: object
    autograd: object
    optim: object
    nn: object


def stack() -> Stack:
    """The agent's training-stack modules (import errors surface here, naming the module)."""
    name = lifecycle.current_name()
    found = Stack(rpc_agents.api(name), rpc_agents.autograd(name), rpc_agents.optim(name), rpc_agents.nn(name))
    _imported_everywhere()
    return found


def optim_module():
    """The agent's DistributedOptimizer module only (building one needs no distributed autograd)."""
    found = rpc_agents.optim(lifecycle.current_name())
    _imported_everywhere()
    return found


def nn_module():
    """The agent's RemoteModule module only (no distributed autograd needed)."""
    found = rpc_agents.nn(lifecycle.current_name())
    _imported_everywhere()
    return found


_ready_case = -1


def _imported_everywhere() -> None:
    """Once per case: every rank has imported the stack before any rank calls another.

    torch.distributed.nn generates the module holding RemoteModule's remote
    forward (``_remote_module_non_scriptable``) when it is imported; a callee
    that has not imported it yet cannot unpickle the request ("No module
    named '_remote_module_non_scriptable'"). Users import it on every worker
    at start-up; the clauses import it at their first use, so they meet here.
    """
    global _ready_case
    if _ready_case != ctx.case_id:
        barrier("training-stack-imported")
        _ready_case = ctx.case_id


# ---------------------------------------------------------------- parameters on owners
def make_param(values: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    """On the owner: a leaf tensor the owner keeps (through an RRef) and optimizers update in place."""
    return values.clone().requires_grad_(requires_grad)


def matmul_rref(weight_rref, x: torch.Tensor) -> torch.Tensor:
    """On the owner: x @ w with the owner's own w; the result carries autograd back to it."""
    return x @ weight_rref.local_value()


def mul_rref(weight_rref, x: torch.Tensor) -> torch.Tensor:
    return weight_rref.local_value() * x


def param_grad(weight_rref):
    """On the owner: the owner's ``.grad`` of the parameter (None if never set)."""
    grad = weight_rref.local_value().grad
    return None if grad is None else grad.clone()


# ---------------------------------------------------------------- optimizers
class PlainSGD(optim.SGD):
    """optim.SGD under another class: no functional twin, so DistributedOptimizer takes the non-functional path."""


class PlainAdam(optim.Adam):
    """optim.Adam under another class (non-functional path)."""


class FailingStep(optim.SGD):
    """Builds fine; every step raises (torch's dist_optimizer_test OptimizerFailingOnStep)."""

    def step(self, closure=None):
        raise ValueError("Error running optimizer.")


class FailingConstructor(optim.SGD):
    def __init__(self, params, *args, **kwargs):
        raise ValueError("Error creating optimizer.")


OPTIMIZERS = {"SGD": (optim.SGD, {"lr": 0.05}), "Adam": (optim.Adam, {"lr": 0.05}),
              "PlainSGD": (PlainSGD, {"lr": 0.05}), "PlainAdam": (PlainAdam, {"lr": 0.05}),
              # torch's other functional twins, with their options as dist_optimizer_test passes them
              "SGD-momentum": (optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True}),
              "Adagrad": (optim.Adagrad, {"lr": 0.05}), "AdamW": (optim.AdamW, {"lr": 0.05, "amsgrad": True}),
              "Adadelta": (optim.Adadelta, {"rho": 0.95}), "RMSprop": (optim.RMSprop, {"lr": 0.05}),
              "Rprop": (optim.Rprop, {"lr": 0.05}), "Adamax": (optim.Adamax, {"lr": 0.05})}
FUNCTIONAL = {name: name not in ("PlainSGD", "PlainAdam") for name in OPTIMIZERS}
# the clauses that train once per optimizer; the others run in one clause (every torch functional twin)
MAIN_OPTIMIZERS = ("SGD", "Adam", "PlainSGD", "PlainAdam")


# ---------------------------------------------------------------- a model split over two owners
SHAPE_IN, SHAPE_HIDDEN = 4, 3


def initial_weights(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE_IN, SHAPE_HIDDEN, generator=gen), torch.randn(SHAPE_HIDDEN, 2, generator=gen)


def batches(seed: int, steps: int, size: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(10_000 + seed)
    return [(torch.randn(size, SHAPE_IN, generator=gen), torch.randn(size, 2, generator=gen)) for _ in range(steps)]


def split_loss(hidden_fn, out_fn, x, y):
    """The model: tanh(x @ w1) @ w2, squared error. w1 and w2 each live on their own worker."""
    return ((out_fn(torch.tanh(hidden_fn(x))) - y) ** 2).mean()


def local_training(optimizer: str, seed: int, steps: int) -> list[torch.Tensor]:
    """The expectation: the same model, data and optimizer in one process."""
    cls, kwargs = OPTIMIZERS[optimizer]
    w1, w2 = (w.clone().requires_grad_() for w in initial_weights(seed))
    opt = cls([w1, w2], **kwargs)  # PlainSGD/PlainAdam step exactly as their parents do, locally
    for x, y in batches(seed, steps):
        opt.zero_grad()
        split_loss(lambda a: a @ w1, lambda h: h @ w2, x, y).backward()
        opt.step()
    return [w1.detach(), w2.detach()]


def distributed_training(optimizer: str, seed: int, steps: int, owners: tuple[str, str]) -> dict:
    """On a trainer: the model's two weights on ``owners``; forward over RPC, dist backward, DistributedOptimizer."""
    s = stack()
    cls, kwargs = OPTIMIZERS[optimizer]
    w1, w2 = initial_weights(seed)
    rrefs = [s.rpc.remote(owners[0], make_param, (w1,)), s.rpc.remote(owners[1], make_param, (w2,))]
    dist_optim = s.optim.DistributedOptimizer(cls, rrefs, **kwargs)
    for x, y in batches(seed, steps):
        with s.autograd.context() as context_id:
            loss = split_loss(lambda a: s.rpc.rpc_sync(owners[0], matmul_rref, (rrefs[0], a)),
                              lambda h: s.rpc.rpc_sync(owners[1], matmul_rref, (rrefs[1], h)), x, y)
            s.autograd.backward(context_id, [loss])
            dist_optim.step(context_id)
    return {"weights": [r.to_here().detach() for r in rrefs], "functional": dist_optim.is_functional_optim,
            "grads": [s.rpc.rpc_sync(o, param_grad, (r,)) for o, r in zip(owners, rrefs)]}


# ---------------------------------------------------------------- shared parameter, many trainers
_SHARED = None


def set_shared(values: torch.Tensor) -> None:
    """On the owner: the one parameter every trainer optimises."""
    global _SHARED
    _SHARED = make_param(values)


def shared_param_rref():
    """On the owner: an RRef (owned here) to the shared parameter."""
    return lifecycle.rpc().RRef(_SHARED)


def shared_value() -> torch.Tensor:
    return _SHARED.detach().clone()


# ---------------------------------------------------------------- RemoteModule helpers
class Seeded(nn.Module):
    """nn.Linear whose weights come from a seed, so a local twin is exact."""

    def __init__(self, seed: int, d_in: int = 4, d_out: int = 3):
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)
        # a generator of its own: modules are built concurrently on agent threads (the global RNG is shared)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(d_out, d_in, generator=gen))
            self.fc.bias.copy_(torch.randn(d_out, generator=gen))

    def forward(self, x):
        return self.fc(x)


class ReturnsArgs(nn.Module):
    """torch's MyModule of remote_module_test: forward(t1, n, s, word=...) returns a tuple of what it got."""

    def __init__(self, first: int = 1):
        super().__init__()
        self.param1 = nn.Parameter(torch.ones(1) * first)

    def forward(self, tensor: torch.Tensor, number: int, word: str = "default"):
        return word, number, tensor + self.param1


class NotAModule:
    def __init__(self, *args, **kwargs):
        pass


def where_module_lives(module_rref) -> tuple[str, bool]:
    """On the owner: which worker holds the module and its training flag."""
    return lifecycle.rpc().get_worker_info().name, module_rref.local_value().training


def forward_remote_module(remote_module, x):
    """On a third worker: a RemoteModule that arrived over RPC runs its forward from there."""
    return remote_module.forward(x), sorted(vars(remote_module))


# ---------------------------------------------------------------- the batch-updating parameter server
# PyTorch's RPC example (pytorch/examples distributed/rpc/batch/parameter_server.py, kept in torch as
# torch/testing/_internal/distributed/rpc/examples/parameter_server_test.py: DistExamplesTest, seed 000):
# trainers fetch the model, compute gradients locally and send them to the parameter server, which
# averages one gradient per trainer, steps SGD with momentum and answers every trainer with the new
# model (an @async_execution future). Local autograd only. Sizes and optimizer are the example's.
PS_IN, PS_OUT, PS_BATCH, PS_BATCHES, PS_LR, PS_MOMENTUM = 100, 30, 20, 4, 0.001, 0.9


def ps_model(seed: int) -> nn.Linear:
    model = nn.Linear(PS_IN, PS_OUT)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.weight.copy_(torch.rand(PS_OUT, PS_IN, generator=gen) * 0.2 - 0.1)
        model.bias.copy_(torch.rand(PS_OUT, generator=gen) * 0.2 - 0.1)
    return model


def ps_batches(trainer_seed: int):
    """The example draws torch.randn; a generator per trainer makes the run repeatable."""
    gen = torch.Generator().manual_seed(trainer_seed)
    for _ in range(PS_BATCHES):
        yield torch.randn(PS_BATCH, PS_IN, generator=gen), torch.zeros(PS_BATCH, PS_OUT)


class BatchUpdateParameterServer:
    def __init__(self, batch_update_size: int, seed: int):
        self.model = ps_model(seed)
        self.lock = threading.Lock()
        self.future_model = torch.futures.Future()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.updates = 0
        self.optimizer = optim.SGD(self.model.parameters(), lr=PS_LR, momentum=PS_MOMENTUM)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self) -> nn.Linear:
        return self.model

    @staticmethod
    @async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        # The example adds the gradients before taking the lock: two trainers' in-place adds can race
        # there. Here they are added under the lock, so the result is exact up to float order.
        with self.lock:
            for p, g in zip(self.model.parameters(), grads, strict=True):
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad += g
            self.curr_update_size += 1
            fut = self.future_model
            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad()
                self.updates += 1
                fut.set_result(self.model)
                self.future_model = torch.futures.Future()
        return fut


def ps_run_trainer(ps_rref, trainer_seed: int) -> int:
    """On a trainer (the example's Trainer.train): one round trip to the server per batch."""
    rpc = lifecycle.rpc()
    loss_fn = nn.L1Loss()
    m = ps_rref.rpc_sync().get_model()
    rounds = 0
    for inputs, labels in ps_batches(trainer_seed):
        loss_fn(m(inputs), labels).backward()
        m = rpc.rpc_sync(ps_rref.owner(), BatchUpdateParameterServer.update_and_fetch_model,
                         args=(ps_rref, [p.grad for p in m.cpu().parameters()]))
        rounds += 1
    return rounds


def ps_run(trainers: list[str], seed: int) -> dict:
    """On the parameter server (the example's run_ps): start every trainer, wait for all."""
    rpc = lifecycle.rpc()
    server = BatchUpdateParameterServer(len(trainers), seed)
    initial = [p.detach().clone() for p in server.model.parameters()]
    ps_rref = rpc.RRef(server)
    futs = [rpc.rpc_async(t, ps_run_trainer, args=(ps_rref, 100 + i)) for i, t in enumerate(trainers)]
    rounds = torch.futures.wait_all(futs)
    return {"initial": initial, "final": [p.detach().clone() for p in server.model.parameters()],
            "rounds": rounds, "updates": server.updates}


def ps_single_process(n_trainers: int, seed: int) -> list[torch.Tensor]:
    """The expectation: every round, the mean of the trainers' gradients on the same model, one SGD step."""
    model = ps_model(seed)
    opt = optim.SGD(model.parameters(), lr=PS_LR, momentum=PS_MOMENTUM)
    loss_fn = nn.L1Loss()
    data = [list(ps_batches(100 + i)) for i in range(n_trainers)]
    for k in range(PS_BATCHES):
        total = [torch.zeros_like(p) for p in model.parameters()]
        for t in range(n_trainers):
            model.zero_grad()
            inputs, labels = data[t][k]
            loss_fn(model(inputs), labels).backward()
            total = [a + p.grad for a, p in zip(total, model.parameters())]
        for p, g in zip(model.parameters(), total):
            p.grad = g / n_trainers
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------- reinforcement learning over RPC
# PyTorch's second RPC example (torch's ReinforcementLearningRpcTest, examples/reinforcement_learning_rpc_test.py):
# an agent on worker0 holds the policy; every other worker runs an observer (made with remote()) with its own
# dummy environment. Per episode the agent asks every observer to run (rpc_async); each observer calls back into
# the agent (rpc_sync on an RRef the agent made of itself) to select actions and report rewards; the agent then
# updates its policy with REINFORCE, locally. Torch's test runs until the running reward passes the threshold.
RL_STEPS, RL_GAMMA, RL_THRESHOLD, RL_MAX_EPISODES = 10, 0.1, 475.0, 200


def _call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    return lifecycle.rpc().rpc_sync(rref.owner(), _call_method, args=[method, rref, *args], kwargs=kwargs)


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x):
        return torch.softmax(self.affine2(torch.relu(self.dropout(self.affine1(x)))), dim=1)


class DummyEnv:
    """The example's stand-in for gym: random states, rewards in [0, threshold), done after RL_STEPS steps."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self.iter = 0

    def reset(self):
        self.iter = 0
        return torch.randn(4, generator=self.gen)

    def step(self, action):
        self.iter += 1
        reward = torch.rand(1, generator=self.gen).item() * RL_THRESHOLD
        return torch.randn(4, generator=self.gen), reward, self.iter >= RL_STEPS


class Observer:
    def __init__(self):
        self.id = lifecycle.rpc().get_worker_info().id
        self.env = DummyEnv(self.id)
        self.steps = 0

    def run_episode(self, agent_rref, n_steps):
        state = self.env.reset()
        for _ in range(n_steps):
            action = _remote_method(RlAgent.select_action, agent_rref, self.id, state)
            state, reward, done = self.env.step(action)
            self.steps += 1
            _remote_method(RlAgent.report_reward, agent_rref, self.id, reward)
            if done:
                break

    def steps_taken(self) -> int:
        return self.steps


class RlAgent:
    def __init__(self, world_size: int):
        rpc = lifecycle.rpc()
        self.agent_rref = rpc.RRef(self)
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.running_reward = 0.0
        self.lock = threading.Lock()  # observers call in concurrently (the example relies on the GIL)
        self.ob_rrefs, self.rewards, self.saved_log_probs = [], {}, {}
        for ob_rank in range(1, world_size):
            info = rpc.get_worker_info(rpc_agents.worker_name(ob_rank))
            self.ob_rrefs.append(rpc.remote(info, Observer))
            self.rewards[info.id], self.saved_log_probs[info.id] = [], []

    def select_action(self, ob_id, state):
        with self.lock:
            dist = torch.distributions.Categorical(self.policy(state.unsqueeze(0)))
            action = dist.sample()
            self.saved_log_probs[ob_id].append(dist.log_prob(action))
        return action.item()

    def report_reward(self, ob_id, reward):
        with self.lock:
            self.rewards[ob_id].append(reward)

    def run_episode(self, n_steps: int) -> None:
        rpc = lifecycle.rpc()
        futs = [rpc.rpc_async(ob.owner(), _call_method, args=(Observer.run_episode, ob, self.agent_rref, n_steps))
                for ob in self.ob_rrefs]
        for fut in futs:
            fut.wait()

    def finish_episode(self) -> float:
        probs, rewards = [], []
        for ob_id in self.rewards:
            probs.extend(self.saved_log_probs[ob_id])
            rewards.extend(self.rewards[ob_id])
        min_reward = min(sum(r) for r in self.rewards.values())
        self.running_reward = 0.05 * min_reward + 0.95 * self.running_reward
        for ob_id in self.rewards:
            self.rewards[ob_id], self.saved_log_probs[ob_id] = [], []
        returns, acc = [], 0.0
        for r in rewards[::-1]:
            acc = r + RL_GAMMA * acc
            returns.insert(0, acc)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + torch.finfo(torch.float32).eps)
        self.optimizer.zero_grad()
        torch.cat([-lp * r for lp, r in zip(probs, returns, strict=True)]).sum().backward()
        self.optimizer.step()
        return min_reward


def rl_run(world_size: int) -> dict:
    """On the agent (the example's run_agent): episodes until the running reward passes the threshold."""
    agent = RlAgent(world_size)
    episodes = 0
    while agent.running_reward <= RL_THRESHOLD and episodes < RL_MAX_EPISODES:
        agent.run_episode(RL_STEPS)
        agent.finish_episode()
        episodes += 1
    steps = [ob.rpc_sync().steps_taken() for ob in agent.ob_rrefs]
    owners = [ob.owner().name for ob in agent.ob_rrefs]
    return {"episodes": episodes, "running_reward": agent.running_reward, "steps": steps, "owners": owners,
            "left": sum(len(v) for v in agent.rewards.values())}
