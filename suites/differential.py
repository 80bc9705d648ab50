"""The differential runner shared by the c10d and DDP differential clauses.

A differential clause has an example type (a frozen dataclass whose repr
rebuilds it: c10d's ``Call``, DDP's ``Case``), a hypothesis strategy drawing
examples, a rank side run by ``World.run`` and an oracle. This module is the
rest, once:

* ``run_on_world``: one example on the world, with the reset ladder: a rank
  that raised leaves a tainted world reset (fresh process groups, so the next,
  shrunk, example starts clean) and hypothesis may shrink (``ExampleFailed``);
  a dead or hung world, or one the reset could not save, ends the clause at
  once (``WorldLost``: each further attempt would cost a new world or a full
  deadline);
* ``explore``: hypothesis runs the pinned examples (``@example``: the calls
  the seeded bugs of tests/seeded/ need, so they are caught on every run),
  then draws the profile's budget (fixtures/hypothesis_profiles.py:
  ``--hypothesis-profile ci|thorough``) and shrinks a failure;
* ``replayed``: the one replay mechanism: ``DISTCONFORM_REPLAY`` holds an
  example's repr, which every failure prints inside a ready-made command
  (``replay_command``); the clause whose example type it names runs exactly
  that example (even one its strategy would never draw), the others skip
  saying whose it is.
"""

from __future__ import annotations

import ast
import os
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from fixtures.errors import RankError, WorldError

REPLAY_ENV = "DISTCONFORM_REPLAY"


class WorldLost(BaseException):
    """The world died (a rank crashed or hung) on an example, or could not be reset after one.

    A BaseException, so hypothesis lets it through at once instead of shrinking
    on a dead world; pytest reports it as the clause's failure.
    """


class ExampleFailed(Exception):
    """A rank raised on an example (the world survived and was reset); hypothesis shrinks it."""


def run_on_world(world, where: str, fn: Callable, *args: Any) -> list:
    """``world.run(fn, *args)``: every rank's result, or the failure with ``where`` (the example, its replay)."""
    __tracebackhide__ = True  # the failure is the message (with the example), not this function's lines
    try:
        return world.run(fn, *args)
    except RankError as exc:
        if world.alive and world.tainted:
            try:
                world.reset()
            except WorldError as reset_error:
                raise WorldLost(f"{exc}\n(resetting the world afterwards failed: {reset_error}){where}") from None
        if not world.alive:
            raise WorldLost(f"{exc}{where}") from None
        raise ExampleFailed(f"{exc}{where}") from None
    except WorldError as exc:  # a rank died or the deadline expired: the world is gone
        raise WorldLost(f"{exc}{where}") from None


@dataclass(frozen=True)
class Pin:
    """An example run before any drawn one, and the seeded bugs of tests/seeded/ it catches (their module names)."""

    example: Any
    catches: tuple[str, ...]


def budget(share: Fraction = Fraction(1)) -> int:
    """Examples to draw: ``share`` of the current profile's ``max_examples`` (at least one)."""
    return max(1, int(settings().max_examples * share))


def explore(strategy: st.SearchStrategy, check: Callable[[Any], None], pins: Iterable[Pin] = (),
            share: Fraction = Fraction(1)) -> None:
    """Run ``check`` on the example of each of ``pins``, then on ``budget(share)`` drawn examples; shrink a failure.

    The example database is off (an example is only meaningful for the backend
    and world it was drawn for) and so is the explain phase (the lines it would
    point at are the harness's, not the backend's); the profile's other phases
    hold (a profile of ``Phase.explicit`` alone runs just the pins).
    """
    phases = tuple(phase for phase in settings().phases if phase is not Phase.explain)

    @settings(max_examples=budget(share), deadline=None, database=None, phases=phases,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(drawn=strategy)
    def differential(drawn):
        check(drawn)

    for pin in reversed(list(pins)):  # hypothesis runs explicit examples in decorator order, top first
        differential = example(drawn=pin.example)(differential)
    differential()


# ------------------------------------------------------------ replay
class BadReplay(ValueError):
    """DISTCONFORM_REPLAY does not hold an example's repr."""


def parse_example(text: str, kind: type) -> Any:
    """The ``kind`` example ``text`` spells (``Kind(field=literal, ...)``, its repr as a failure prints it).

    Strictly decoded: the text comes from the environment, so it is parsed,
    never evaluated; only literal field values are accepted. A well-formed repr
    of another example type raises ``OtherExample``.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:  # ValueError: a NUL byte
        raise BadReplay(f"{REPLAY_ENV} is not a Python expression ({getattr(exc, 'msg', exc)}): {text[:200]!r}") from None
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name)):
        raise BadReplay(f"{REPLAY_ENV} must be an example's repr, Kind(field=value, ...): {text!r}")
    if tree.func.id != kind.__name__:
        raise OtherExample(tree.func.id)
    if tree.args or any(keyword.arg is None for keyword in tree.keywords):
        raise BadReplay(f"{REPLAY_ENV}: {kind.__name__}(...) takes its fields by name, as its repr prints them")
    hints = typing.get_type_hints(kind)
    fields = {}
    for keyword in tree.keywords:
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, MemoryError, RecursionError):  # TypeError: {[1]: 2}, an unhashable key
            raise BadReplay(f"{REPLAY_ENV}: field {keyword.arg!r} of {kind.__name__} is not a literal: "
                            f"{ast.unparse(keyword.value)[:200]}") from None
        if keyword.arg in hints and not _is_a(value, hints[keyword.arg]):
            expected = getattr(hints[keyword.arg], "__name__", str(hints[keyword.arg]))
            raise BadReplay(f"{REPLAY_ENV}: field {keyword.arg!r} of {kind.__name__} must be {expected}, "
                            f"not {type(value).__name__}: {value!r:.200}")
        fields[keyword.arg] = value
    try:
        return kind(**fields)
    except TypeError as exc:
        raise BadReplay(f"{REPLAY_ENV}: {exc}") from None


def _is_a(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the field type ``hint`` (a class, or a union of classes and None)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    return any(isinstance(value, typing.get_origin(option) or option) for option in options)


class OtherExample(Exception):
    """DISTCONFORM_REPLAY holds another clause's example (its type's name is the argument)."""


def replayed(kind: type) -> Any | None:
    """The ``kind`` example ``DISTCONFORM_REPLAY`` holds, or None when it is unset.

    A replay of another clause's example type skips this clause saying so; one
    that is not an example's repr fails it naming the problem.
    """
    text = os.environ.get(REPLAY_ENV)
    if not text:
        return None
    try:
        return parse_example(text, kind)
    except OtherExample as other:
        pytest.skip(f"{REPLAY_ENV} replays a {other.args[0]}, another clause's example, not a {kind.__name__}")
    except BadReplay as exc:
        pytest.fail(str(exc), pytrace=False)


def replay_command(example_value: Any, clause_file: str, backend: str, world_size: int, plugins: Iterable[str] = (),
                   keyword: str = "") -> str:
    """The shell command that runs exactly ``example_value`` again (``plugins``: the run's --backend-plugin)."""
    plugin_args = "".join(f" --backend-plugin {p}" for p in plugins)
    select = f" -k {keyword}" if keyword else ""
    return (f"{REPLAY_ENV}=\"{example_value!r}\" python -m pytest {clause_file}{select}{plugin_args} "
            f"--backend {backend} --world-size {world_size}")
