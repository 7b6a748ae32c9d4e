"""The family protocol (zoo.families.base): a family written in one file, tests/toy_family.py, is indexed,
searched, gotten, materialized, estimated and shown by zoo with no other file touched. Adding it is

    tests/toy_family.py | 46 ++++++++++++++++++++++++++++++++++++++++++++++
    1 file changed, 46 insertions(+)

and naming it in zoo.families.FAMILIES (here at run time; a shipped family is a line there)."""

import pytest
import torch

from zoo.families import FAMILIES


@pytest.fixture
def toy(monkeypatch, tmp_path):
    import zoo

    monkeypatch.setitem(FAMILIES, "toy", "tests.toy_family")
    return zoo.connect(f"sqlite:///{tmp_path / 'toy.db'}")


def test_a_family_in_one_file_works_end_to_end(toy, capsys):
    from zoo.cli import main

    assert toy.index("toy").indexed == ["toy/mlp"]
    assert toy.index("toy", pretrained=True).indexed == ["toy/mlp.wide"]
    assert toy.index("toy").unchanged == ["toy/mlp"]  # its versions() decide what is rebuilt

    # parameters counted by hand: 8x16 + 16 + 16x3 + 3 = 195; the wide variant 8x64 + 64 + 64x3 + 3 = 771
    assert [(i.name, i.params) for i in toy.search("family=toy", order_by="params")] == [
        ("toy/mlp", 195),
        ("toy/mlp.wide", 771),
    ]
    assert [i.name for i in toy.search("family=toy and kind=variant and license=mit")] == ["toy/mlp.wide"]
    info = toy.info("toy/mlp")
    assert (info.task, info.scan_status, info.flops) == ("toy-regression", "ok", 2 * (8 * 16 + 16 * 3))

    module = toy.get("toy/mlp")
    assert all(t.is_meta for t in module.state_dict().values())
    module.materialize()
    assert module(torch.ones(2, 8)).shape == (2, 3)
    assert toy.estimate("toy/mlp.wide", batch=4, dtype="fp32").weights == 771 * 4

    assert main(["--registry", toy.url, "show", "toy/mlp.wide"]) == 0
    shown = capsys.readouterr().out
    assert "toy/mlp.wide" in shown and "771" in shown and "toy-regression" in shown
