"""Issue 38, the fourth hostile pass: a glob that made the static catalog's grammar backtrack, a DCP tensor in
30,000 chunks, a cast load under `ulimit -v`, and scan inputs that are not tensors or shapes. Slowness shows as
a child process that does not finish in a generous time, never as a timed assertion."""

import itertools
import json
import math
import random
import shutil
import sqlite3
import subprocess
import sys
import warnings

import pytest
import torch

from tests.conftest import ROOT
from zoo.errors import CheckpointError, InvalidArgument
from zoo.registry.where import like_pattern

GRAMMAR = ROOT / "zoo" / "web" / "static" / "grammar.js"


# --- 1. the static catalog's globs: no backtracking, the server's answers -------------------------------------


def server_glob(glob: str, text: str) -> bool:
    """`~` as zoo.registry.where compiles it for SQLite: LIKE with backslash escapes, ASCII case folded."""
    con = sqlite3.connect(":memory:")
    try:
        return bool(con.execute("SELECT lower(?) LIKE lower(?) ESCAPE '\\'", (text, like_pattern(glob))).fetchone()[0])
    finally:
        con.close()


def server_name_glob(glob: str, name: str, short: str) -> bool:
    """On `name`, a glob that does not start with '*' also matches the bare name (where.py's _glob)."""
    return server_glob(glob, name) or (not glob.startswith("*") and server_glob(glob, short))


def run_grammar(tmp_path, script: str, data) -> list:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: static/grammar.js not run")
    (tmp_path / "cases.json").write_text(json.dumps(data))
    code = (
        f"import * as g from {json.dumps(GRAMMAR.as_uri())};\n"
        f"import {{ readFileSync }} from 'node:fs';\n"
        f"const cases = JSON.parse(readFileSync(process.argv[1], 'utf8'));\n{script}"
    )
    # a backtracking matcher takes minutes (hours) on these: the timeout is the failure, not a clock
    done = subprocess.run(
        [node, "--input-type=module", "-e", code, str(tmp_path / "cases.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_38_a_glob_of_stars_and_question_marks_does_not_freeze_the_page(tmp_path):
    search = "name~'*?*?*?*?*?*?*?*Q'"  # 23 characters: 5-10 s a name as a regular expression in V8
    rows = [
        {"name": "timm/" + "a" * 200, "short": "a" * 200},
        {"name": "timm/" + "a" * 200 + "q", "short": "q"},
        {"name": "timm/a" * 40, "short": "x"},
        {"name": "Q", "short": "Q"},
    ]
    script = """process.stdout.write(JSON.stringify(cases.rows.map(
      (row) => g.matches(g.parse(cases.search, { name: "string" }), row))));"""
    got = run_grammar(tmp_path, script, {"search": search, "rows": rows})
    glob = "*?*?*?*?*?*?*?*Q"
    assert got == [server_name_glob(glob, r["name"], r["short"]) for r in rows] == [False, True, False, False]


def _random_text(rng: random.Random, alphabet: str, most: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))


def test_38_the_pages_globs_answer_as_the_servers_do(tmp_path):
    """Random globs against random names and names made to match them: `?` one code point, `*` any run,
    `%`, `_` and backslash plain characters, ASCII letters' case ignored and no other (SQLite's LIKE)."""
    rng = random.Random(38)
    plain = "aAbBzZ.-/_%\\+()^$|éÉßẞ🙂 "
    cases = []
    for _ in range(3000):
        glob = _random_text(rng, plain + "*?*?", 8)
        if rng.random() < 0.5:  # a name the glob may well match: every wildcard filled in, case flipped
            text = "".join(
                _random_text(rng, plain, 3)
                if c == "*"
                else rng.choice(plain)
                if c == "?"
                else c.swapcase()
                if rng.random() < 0.3
                else c
                for c in glob
            )
        else:
            text = _random_text(rng, plain, 10)
        cases.append({"glob": glob, "name": text, "short": text[len(text) // 2 :]})
    script = """process.stdout.write(JSON.stringify(cases.map(({ glob, name, short }) => [
      g.matches({ field: "family", op: "~", value: glob }, { family: name }),
      g.matches({ field: "name", op: "~", value: glob }, { name, short })])));"""
    got = run_grammar(tmp_path, script, cases)
    want = [[server_glob(c["glob"], c["name"]), server_name_glob(c["glob"], c["name"], c["short"])] for c in cases]
    assert got == want
    assert 300 < sum(m for m, _ in want) < 2700  # both answers are common: the comparison means something


# --- 2. DCP: one tensor in many chunks --------------------------------------------------------------------------


def save_in_blocks(tensor: torch.Tensor, rows: int, cols: int, path):
    """A real dcp.save of a 2-D tensor as chunks of rows x cols, as that many ranks would save their shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    class Blocks(DefaultSavePlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            items = []
            for i, j in itertools.product(range(0, tensor.shape[0], rows), range(0, tensor.shape[1], cols)):
                offsets, sizes = torch.Size([i, j]), torch.Size([rows, cols])
                items.append(
                    WriteItem(
                        MetadataIndex("t", offsets),
                        WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            ChunkStorageMetadata(offsets, sizes),
                            TensorProperties.create_from_tensor(tensor),
                            tensor.size(),
                        ),
                    )
                )
            self.plan = SavePlan(items, planner_data=plan.planner_data)
            return self.plan

        def resolve_data(self, item):
            (i, j), (r, c) = item.index.offset, item.tensor_data.chunk.sizes
            return tensor[i : i + r, j : j + c].clone()

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore")
        dcp.save({"t": tensor}, checkpoint_id=str(path), no_dist=True, planner=Blocks())
    return path


@pytest.mark.slow  # a bounded process: 15 s
def test_38_a_tensor_in_30000_chunks_loads(tmp_path):
    """[1, 30000] saved as 30,000 [1, 1] chunks (legal: 30,000 ranks' shards): comparing every pair of chunks
    took minutes; the load is checked in a child that has two minutes for what takes seconds."""
    n = 30_000
    path = tmp_path / "columns"
    try:
        save_in_blocks(torch.arange(n, dtype=torch.float32).reshape(1, n), 1, 1, path)
        code = (
            "import sys, torch\n"
            "from zoo.weights.dcp import DcpSource\n"
            "with DcpSource(sys.argv[1]) as source:\n"
            "    assert len(source.tensors['t'].chunks) == int(sys.argv[2])\n"
            "    dest = torch.empty(source.specs['t'].shape)\n"
            "    source.read_into('t', dest)\n"
            "    half = torch.empty(1, 3)\n"
            "    source.read_into('t', half, ((0, 1), (14999, 15002)))\n"
            "n = int(sys.argv[2])\n"
            "assert torch.equal(dest, torch.arange(n, dtype=torch.float32).reshape(1, n))\n"
            "assert half.tolist() == [[14999, 15000, 15001]]\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(path), str(n)], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        shutil.rmtree(path, ignore_errors=True)  # 50 MB of chunk archives


def test_38_chunks_that_overlap_are_still_refused(tmp_path):
    """Sizes that add up to the shape are not enough: a chunk moved onto another's place overlaps it and leaves
    a hole, and is refused before any data is read."""
    import pickle

    from zoo.weights.dcp import DcpSource

    path = save_in_blocks(torch.arange(4.0).reshape(2, 2), 1, 1, tmp_path / "grid")
    with DcpSource(path) as source:  # as saved: it loads
        dest = torch.empty(2, 2)
        source.read_into("t", dest)
        assert dest.tolist() == [[0, 1], [2, 3]]
    metadata = pickle.loads((path / ".metadata").read_bytes())  # the test's own file: plain pickle is fine
    chunks = metadata.state_dict_metadata["t"].chunks
    assert [tuple(c.offsets) for c in chunks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    chunks[1].offsets = torch.Size([0, 0])  # two chunks at (0, 0), none at (0, 1)
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="chunks of t.* overlap"):
        DcpSource(path)


def test_38_the_tiling_check_agrees_with_counting_every_element():
    """zoo.weights.dcp's tiling check against a count of the chunks over every element, on random chunks and on
    grids with a chunk duplicated or dropped: accepted exactly when every element is in exactly one chunk."""
    import numpy as np

    from zoo.weights.dcp import _Chunk
    from zoo.weights.tiling import check_tiling

    rng = random.Random(38)
    verdicts = set()
    for _ in range(5000):
        shape = tuple(rng.randint(0, 4) for _ in range(rng.randint(0, 3)))
        if shape and rng.random() < 0.5:  # a grid, sometimes spoiled
            cuts = [sorted({0, n, rng.randint(0, n), rng.randint(0, n)}) for n in shape]
            chunks = [
                _Chunk(tuple(c[i] for c, i in zip(cuts, at)), tuple(c[i + 1] - c[i] for c, i in zip(cuts, at)))
                for at in itertools.product(*(range(len(c) - 1) for c in cuts))
            ]
            if chunks and rng.random() < 0.5:
                chunks.append(rng.choice(chunks))
                chunks.remove(rng.choice(chunks))
        else:
            chunks = []
            for _ in range(rng.randint(0, 6)):
                offsets = tuple(rng.randint(0, n) for n in shape)
                chunks.append(_Chunk(offsets, tuple(rng.randint(0, n - o) for o, n in zip(offsets, shape))))
        count = np.zeros(shape, dtype=int)
        for c in chunks:
            count[tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))] += 1
        try:
            check_tiling("t", shape, chunks, "test")
            accepted = True
        except CheckpointError:
            accepted = False
        assert accepted == bool((count == 1).all()), (shape, chunks)
        verdicts.add((accepted, sum(math.prod(c.sizes) for c in chunks) == math.prod(shape)))
    assert verdicts == {(True, True), (False, True), (False, False)}  # overlaps with the right sum included


# --- 3. a cast load where the file cannot be mapped -------------------------------------------------------------


def test_38_a_cast_load_reads_a_file_that_cannot_be_mapped(tmp_path):
    """Under `ulimit -v` a 4 GiB file cannot be mapped whole, though the tensors a model loads fit: a cast load
    (bf16, by default and with copy=True) reads them instead of failing with OSError (ENOMEM) from mmap."""
    weight, bias = torch.randn(256, 256), torch.randn(256)
    header = {
        "weight": {"dtype": "F32", "shape": [256, 256], "data_offsets": [0, weight.nbytes]},
        "bias": {"dtype": "F32", "shape": [256], "data_offsets": [weight.nbytes, weight.nbytes + bias.nbytes]},
        "unused": {
            "dtype": "F32",
            "shape": [1 << 30],
            "data_offsets": [weight.nbytes + bias.nbytes, weight.nbytes + bias.nbytes + (4 << 30)],
        },
    }
    text = json.dumps(header).encode()
    text += b" " * ((56 - len(text)) % 64)
    path = tmp_path / "big.safetensors"
    try:
        with open(path, "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text + weight.numpy().tobytes() + bias.numpy().tobytes())
            f.truncate(8 + len(text) + weight.nbytes + bias.nbytes + (4 << 30))  # a hole: no disk
        torch.save({"weight": weight, "bias": bias}, tmp_path / "expected.pt")
        code = (
            "import resource, sys, torch\n"
            "from torch import nn\n"
            "from zoo.materialize import materialize\n"
            "expected = {k: v.to(torch.bfloat16) for k, v in torch.load(sys.argv[2]).items()}\n"
            "size = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) << 10\n"
            "resource.setrlimit(resource.RLIMIT_AS, (size + (120 << 20), resource.RLIM_INFINITY))\n"
            "for copy in (None, True):\n"
            "    with torch.device('meta'):\n"
            "        m = nn.Linear(256, 256)\n"
            "    materialize(m, weights=sys.argv[1], strict=False, dtype=torch.bfloat16, copy=copy)\n"
            "    assert all(torch.equal(m.state_dict()[k], v) for k, v in expected.items()), copy\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(path), str(tmp_path / "expected.pt")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        path.unlink(missing_ok=True)


# --- 4. scan's inputs -------------------------------------------------------------------------------------------


@pytest.fixture
def resnet_registry(small_registry) -> str:
    """A registry holding timm/resnet18 (the session's small registry, which these tests only read)."""
    return small_registry


@pytest.mark.parametrize(
    "inputs, named",
    [
        ((None,), "None, is not a tensor or a shape"),
        ((5,), "5, is not a tensor or a shape"),
        (((1.5, 3, 224, 224),), r"\(1.5, 3, 224, 224\), is not a shape: its sizes are not all whole numbers"),
        (((float("nan"),),), r"\(nan,\), is not a shape"),
        (((True, 3, 224, 224),), "is not a shape"),
        ((("a", "b"),), r"\('a', 'b'\), holds 'a', which is not a tensor or a shape"),
        (([],), r"\[\], is an empty list"),
        (({},), r"\{\}, is an empty dict"),
        (([1, 3, 224, 224],), "is a list of numbers, not a tuple"),
        (([(3, 64, 64), None],), "holds None, which is not a tensor"),
        (((1, 3, 64, 64), object()), "2, <object object at .*>, is not a tensor or a shape"),
    ],
)
def test_38_a_scan_input_that_is_not_a_tensor_or_shape_is_refused_by_name(resnet_registry, inputs, named):
    import zoo

    with pytest.raises(InvalidArgument, match=f"scan's input .*{named}.*give a tensor, or a shape as a tuple"):
        zoo.scan("timm/resnet18", *inputs, registry=resnet_registry)


@pytest.mark.parametrize("batch", [0, -1, 1.5, None, True, "2"])
def test_38_a_scan_batch_that_is_not_a_whole_number_is_refused(resnet_registry, batch):
    import zoo

    with pytest.raises(InvalidArgument, match="batch must be a whole number"):
        zoo.scan("timm/resnet18", batch=batch, registry=resnet_registry)


def test_38_what_scan_took_before_it_still_takes(resnet_registry):
    import zoo

    def out(*inputs, **options):
        return zoo.scan("timm/resnet18", *inputs, registry=resnet_registry, **options).outputs

    assert (
        out((2, 3, 64, 64))
        == out(torch.Size([2, 3, 64, 64]))
        == out(torch.empty(2, 3, 64, 64))
        == [["", [2, 1000], "float32"]]
    )
    assert out(batch=2) == [["", [2, 1000], "float32"]]
    m = zoo.Zoo(resnet_registry).get("timm/resnet18")
    assert zoo.scan(m, torch.empty(1, 3, 32, 32)).outputs == [["", [1, 1000], "float32"]]
