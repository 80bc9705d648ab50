"""No CUDA-ism in the harness or the clauses (issue 37): devices are chosen through the spec's device type and
``torch.accelerator``, so a vendor's PrivateUse1 device (native/device/: dcdev) runs every clause.

An AST audit of fixtures/ and suites/: a ``torch.cuda`` attribute, or a string that names the CUDA device
(``"cuda"``, ``"cuda:0"``, a backend string's ``cuda:nccl``) outside docstrings, fails here unless the
allow-list below names its file, with how many such uses it holds and why that file is CUDA-specific. A
count, not a file: a new CUDA-ism in an allowed file fails too.
"""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUDITED = ("fixtures", "suites")
# a device or backend string naming CUDA: "cuda", "cuda:0", "cpu:gloo,cuda:nccl", "worker1/cuda:0"; prose (a string
# with spaces: help texts, messages) and names of CUDA-specific specs ("gloo-cuda") are not device choices
CUDA_STRING = re.compile(r"(?<![\w-])cuda(?![\w-])")

# path -> (uses, why the file may name CUDA)
ALLOWED: dict[str, tuple[int, str]] = {
    "fixtures/gpu_check.py": (2, "the CUDA lane's own check (python -m fixtures.gpu_check): gloo-cuda and nccl "
                                 "on a lent GPU"),
    "fixtures/devices.py": (3, "the skip text says 'GPUs' for CUDA ('needs 3 GPUs'), '<n> <type> devices' for "
                               "every other type"),
    "fixtures/launch/rank.py": (1, "a launched rank reports the device counts of the in-tree accelerators "
                                   "(cuda, xpu) to the controller; a plugin device is counted by its own module"),
    "suites/c10d/fault_tolerance_measure.py": (5, "torch 2.14's measurement of mixed strings 'cpu:X,cuda:gloo' (a "
                                                  "Python ProcessGroup, a Backend subclass, the reference) and of a "
                                                  "group with a cuda backend beside the cpu one, as torch's own test "
                                                  "builds them; no CUDA tensor is made"),
    "suites/c10d/test_device_routing.py": (4, "the mixed string's second device: torch registers 'cuda:gloo' "
                                              "without a GPU and the clause asks who serves cuda; only CPU "
                                              "tensors move"),
    "suites/c10d/test_reconfigure.py": (1, "a group with two backends (cpu gloo, cuda nccl), registered and never "
                                           "used, as torch's test_c10d_fault_tolerance builds it to be refused"),
    "suites/dist_autograd/test_remote_module.py": (7, "RemoteModule's 'worker/cuda:0' strings: torch parses "
                                                      "the CUDA form without a GPU, and the clauses check that "
                                                      "parse and its errors"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def cuda_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) of every CUDA-ism in ``source``: ``torch.cuda``, or a string naming the cuda device."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Name)
                and node.value.id == "torch"):
            found.append((node.lineno, "torch.cuda"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and not re.search(r"\s", node.value) and CUDA_STRING.search(node.value)):
            found.append((node.lineno, repr(node.value)[:60]))
    return sorted(found)


def audited_files() -> list[str]:
    paths = []
    for top in AUDITED:
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            paths += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in files if f.endswith(".py")]
    return sorted(paths)


def test_no_cuda_outside_the_cuda_specific_files():
    """fixtures/ and suites/ name CUDA only where the allow-list says, as often as it says."""
    wrong = []
    for path in audited_files():
        with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
            uses = cuda_uses(fh.read())
        allowed = ALLOWED.get(path, (0, ""))[0]
        if len(uses) != allowed:
            wrong.append(f"{path}: {len(uses)} CUDA uses, {allowed} allowed: "
                         + "; ".join(f"line {line} {what}" for line, what in uses))
    assert not wrong, ("choose devices through the spec's device_type and torch.accelerator, or add the file to "
                       "ALLOWED with why it is CUDA-specific:\n" + "\n".join(wrong))


def test_every_allowed_file_exists():
    """An allow-list entry for a file that moved or went is stale."""
    assert [p for p in ALLOWED if not os.path.exists(os.path.join(ROOT, p))] == []


def test_the_audit_sees_each_form_of_cuda_ism():
    """The audit catches torch.cuda, device strings and backend strings, and leaves docstrings and other names."""
    source = ('"""cuda in a docstring is prose."""\n'
              'import torch\n'
              'a = torch.cuda.device_count()\n'
              'b = torch.ones(2, device="cuda")\n'
              'c = "cuda:1"\n'
              'd = "cpu:gloo,cuda:nccl"\n'
              'e = "dcdev:0"\n'
              'f = "cudagraphs"\n'
              'g = "gloo-cuda"\n'
              'h = "run with --backend cuda:nccl"\n')
    assert [line for line, _ in cuda_uses(source)] == [3, 4, 5, 6]
