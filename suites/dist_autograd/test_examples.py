"""Contract: PyTorch's RPC examples run on the agent and train to what one process computes.

The batch-updating parameter server (torch's DistExamplesTest,
examples/parameter_server_test.py; seed 000): worker0 holds an
nn.Linear(100, 30) behind an RRef, every other worker is a trainer that
fetches the model, computes L1-loss gradients on its own batches and sends
them with an @async_execution call; the server waits for one gradient per
trainer, averages, steps SGD (lr 0.001, momentum 0.9) and answers every
trainer with the new model. After 4 rounds the server's parameters equal a
single-process run of the same rounds (same data, same averaging), every
trainer ran 4 rounds and the server stepped 4 times.

Reinforcement learning over RPC (torch's ReinforcementLearningRpcTest): an
agent on worker0 with observers made by remote() on every other worker;
observers call back into the agent through an RRef it made of itself while
the agent waits on them. The agent solves the dummy environment (running
reward above the threshold) within a bound of episodes, every observer ran
every step of every episode, and nothing is left unaccounted for.
"""

import torch

from backends.rpc_agents import worker_name
from fixtures.rank import ctx
from suites.dist_autograd import training

SEED = 7


# ---------------------------------------------------------------- rank side
def batch_parameter_server():
    if ctx.rank != 0:
        return None  # a trainer: its agent serves the server's calls
    return training.ps_run([worker_name(r) for r in range(1, ctx.world_size)], SEED)


def reinforcement_learning():
    if ctx.rank != 0:
        return None  # an observer's worker: its agent serves
    return training.rl_run(ctx.world_size)


# ---------------------------------------------------------------- clauses
def test_batch_updating_parameter_server_equals_single_process(rpc_agent):
    """The batch parameter server with every other worker as a trainer ends where one process ends."""
    got = rpc_agent.run(batch_parameter_server)[0]
    trainers = rpc_agent.world_size - 1
    assert got["rounds"] == [training.PS_BATCHES] * trainers, f"rounds per trainer: {got['rounds']}"
    assert got["updates"] == training.PS_BATCHES, f"the server stepped {got['updates']} times"
    expected = training.ps_single_process(trainers, SEED)
    for name, initial, final, want in zip(("weight", "bias"), got["initial"], got["final"], expected):
        # compare the change: the example's lr makes it small next to the weights themselves
        torch.testing.assert_close(final - initial, want - initial, rtol=1e-4, atol=1e-8,
                                   msg=lambda m: f"{name} change after {training.PS_BATCHES} rounds of "
                                                 f"{trainers} trainers: {m}")
        assert (want - initial).abs().max() > 1e-6, f"{name}: the single-process run did not move it"


def test_reinforcement_learning_example_solves(rpc_agent):
    """The RL example (agent on worker0, an observer per other worker, nested callbacks) reaches its threshold."""
    got = rpc_agent.run(reinforcement_learning)[0]
    assert got["running_reward"] > training.RL_THRESHOLD and got["episodes"] < training.RL_MAX_EPISODES, \
        f"after {got['episodes']} episodes the running reward is {got['running_reward']}"
    observers = rpc_agent.world_size - 1
    assert got["owners"] == [worker_name(r) for r in range(1, observers + 1)], f"observers on {got['owners']}"
    assert got["steps"] == [got["episodes"] * training.RL_STEPS] * observers and got["left"] == 0, \
        f"{got['episodes']} episodes: observer steps {got['steps']}, {got['left']} rewards left over"
