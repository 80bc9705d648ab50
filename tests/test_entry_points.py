"""The README's Quickstart and CI stay one and the same command."""

import os
import re

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _quickstart_commands() -> list[str]:
    with open(os.path.join(REPO_ROOT, "README.md")) as fh:
        text = fh.read()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)]


def test_quickstart_has_exactly_two_commands():
    """(a) the conformance suite, (b) the project's own tests; each one line."""
    commands = _quickstart_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in c for c in commands), commands
    assert commands[0].endswith("pytest suites/") and commands[1].endswith("pytest tests/"), commands
    assert commands[0].startswith("bash .ci/setup suites && ") and commands[1].startswith("bash .ci/setup tests && ")
    with open(os.path.join(REPO_ROOT, ".ci", "setup")) as fh:
        assert "pip install -q -r requirements.txt" in fh.read()  # the set-up both commands share


def test_ci_runs_command_b_exactly_as_the_readme_writes_it():
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as fh:
        lines = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    assert _quickstart_commands()[1] in lines, f".ci/run does not run README command (b) verbatim: {lines}"


def test_torch_is_pinned():
    """An unpinned torch pulls the CUDA build (gigabytes); the CPU wheel is 2.13.0."""
    with open(os.path.join(REPO_ROOT, "requirements.txt")) as fh:
        requirements = [line.split("#")[0].strip() for line in fh if line.split("#")[0].strip()]
    torch_lines = [r for r in requirements if re.match(r"torch\b", r)]
    assert torch_lines == ["torch==2.13.0"], torch_lines
    for needed in ("numpy", "pytest", "pytest-xdist", "pytest-timeout", "hypothesis"):
        assert any(re.match(rf"{needed}\b", r) for r in requirements), needed
