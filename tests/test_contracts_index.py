"""CONTRACTS.md is generated from the suites and never stale."""

import inspect

from reports import contracts


def test_contracts_md_is_up_to_date():
    assert contracts.main(["--check"]) == 0, "CONTRACTS.md is stale: run python -m reports.contracts and commit it"


def test_check_fails_on_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "CONTRACTS.md"
    stale.write_text("# an old index\n")
    assert contracts.main(["--check", "--output", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert contracts.main(["--check", "--output", str(tmp_path / "missing.md")]) == 1


def test_every_clause_of_a_module_is_listed_with_its_contract_and_needs():
    import suites.c10d.test_all_reduce as module

    text = open(contracts.OUTPUT).read()
    assert "### Contract: all_reduce. (`suites/c10d/test_all_reduce.py`)" in text
    tests = [f for name, f in vars(module).items() if name.startswith("test_") and inspect.isfunction(f)]
    assert tests
    for function in tests:
        clause = inspect.getdoc(function).splitlines()[0]
        assert f"| {clause} | `{function.__name__}` | collective=all_reduce" in text, function.__name__
    assert "feature=subgroups; world size >= 3" in text  # min_world_size markers are shown
