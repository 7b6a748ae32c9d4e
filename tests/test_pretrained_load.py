"""weights="pretrained": published weights by name, from the libraries' own caches, bitwise equal to what
timm.create_model(tag, pretrained=True) and torchvision.models.get_model(name, weights=W) build from the
same cached files. No network: the tests write seeded stand-in checkpoints in the exact layout and format
the Hugging Face hub cache and torch hub's checkpoint cache hold, and serve downloads from 127.0.0.1."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


# --- caches laid out as the libraries lay them out ---------------------------------------------------


def hub_file(hub_cache: Path, repo: str, filename: str, data: bytes, revision: str = "a" * 40) -> Path:
    """One file of a hub repo in huggingface_hub's cache layout: the blob named by its sha256 (an LFS file's
    ETag), a snapshot symlink to it, and refs/main naming the snapshot."""
    root = hub_cache / f"models--{repo.replace('/', '--')}"
    blob = root / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = root / "snapshots" / revision / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(revision)
    return link


def seeded_state(model_name: str, seed: int, **kwargs) -> dict:
    """The library's own model's state dict, every value drawn from a seeded generator."""
    import timm

    torch.manual_seed(seed)
    model = timm.create_model(model_name, **kwargs)
    g = torch.Generator().manual_seed(seed)
    return {
        k: (torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()).contiguous()
        for k, v in model.state_dict().items()
    }


def safetensors_bytes(state: dict) -> bytes:
    from safetensors.torch import save

    return save(state)


def pickle_bytes(state: dict, tmp: Path) -> bytes:
    path = tmp / "state.pth"
    torch.save(state, path)
    return path.read_bytes()


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """HF_HOME and TORCH_HOME in tmp, offline; huggingface_hub reads its cache path and offline flag from
    its constants module (set at its import), so those follow the environment here."""
    from huggingface_hub import constants

    hf_home, torch_home = tmp_path / "hf", tmp_path / "torch"
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hf_home / "hub", torch_home / "hub" / "checkpoints"


def add_row(url: str, name: str, family: str, builder: str, tag: str | None = None, kwargs: dict | None = None):
    """A registry row as the indexer writes a variant (kind, tag, arch_name) or an architecture."""
    from zoo.indexing import indexer
    from zoo.recipe import Recipe
    from zoo.registry import db

    db.open_registry(url, write=True, create=True)
    record, table = indexer.record_of(name, Recipe(family, builder, kwargs or {}), None)
    if tag:
        record.update(kind="variant", tag=tag, arch_name=name.split(".")[0])
    indexer.save(url, record, table)


def assert_bitwise(ours, theirs) -> None:
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def on_meta(module) -> bool:
    return all(t.is_meta for t in [*module.parameters(), *module.buffers()])


# --- timm through the Hugging Face hub cache -----------------------------------------------------------


def _old_swin_keys(state: dict) -> dict:
    """A swin checkpoint as Microsoft published it (head.*, each stage's downsample at the end of the stage
    before): timm's swin checkpoint_filter_fn renames these keys to timm's layout."""
    out = {}
    for k, v in state.items():
        k = re.sub(r"layers\.(\d+)\.downsample", lambda m: f"layers.{int(m.group(1)) - 1}.downsample", k)
        out[k.replace("head.fc.", "head.")] = v
    return out


TIMM_CASES = {
    # tag: (how the cached file is made, file name in the hub repo)
    "resnet18.a1_in1k": (lambda tmp: safetensors_bytes(seeded_state("resnet18", 1)), "model.safetensors"),
    # only a pickle in the repo: timm falls back to pytorch_model.bin (read weights-only)
    "resnet18.tv_in1k": (lambda tmp: pickle_bytes(seeded_state("resnet18", 2), tmp), "pytorch_model.bin"),
    # a 224-px checkpoint for the 384-px model: the ViT filter resamples pos_embed (a computed tensor)
    "vit_tiny_patch16_384.augreg_in21k_ft_in1k": (
        lambda tmp: safetensors_bytes(seeded_state("vit_tiny_patch16_224", 3)),
        "model.safetensors",
    ),
    # keys renamed by the swin filter (pass-through tensors under new names)
    "swin_tiny_patch4_window7_224.ms_in1k": (
        lambda tmp: safetensors_bytes(_old_swin_keys(seeded_state("swin_tiny_patch4_window7_224", 4))),
        "model.safetensors",
    ),
    # a 21k-class head: the variant is built with its weights' num_classes
    "vit_tiny_patch16_224.augreg_in21k": (
        lambda tmp: safetensors_bytes(seeded_state("vit_tiny_patch16_224", 5, num_classes=21843)),
        "model.safetensors",
    ),
}


@pytest.mark.parametrize("tag", list(TIMM_CASES))
def test_timm_variant_loads_bitwise_as_timm_does(tag, caches, fresh_url, tmp_path):
    import timm

    import zoo

    hub_cache, _ = caches
    make, filename = TIMM_CASES[tag]
    hub_file(hub_cache, f"timm/{tag}", filename, make(tmp_path))
    add_row(fresh_url, f"timm/{tag}", "timm", tag, tag=tag.split(".", 1)[1])
    ours = zoo.connect(fresh_url).get(f"timm/{tag}", weights="pretrained")
    theirs = timm.create_model(tag, pretrained=True)
    assert_bitwise(ours, theirs)


def test_a_pretrained_load_by_name_never_imports_sqlalchemy(caches, fresh_url, tmp_path):
    """weights="pretrained" reads its row (and the loader arguments recorded with it) through the sqlite3
    reader: a fresh process loads timm's published weights without importing SQLAlchemy."""
    hub_cache, _ = caches
    tag = "resnet18.a1_in1k"
    hub_file(hub_cache, f"timm/{tag}", "model.safetensors", TIMM_CASES[tag][0](tmp_path))
    add_row(fresh_url, f"timm/{tag}", "timm", tag, tag="a1_in1k")
    code = (
        "import sys, zoo\n"
        f"m = zoo.get('timm/{tag}', weights='pretrained')\n"
        "assert not any(t.is_meta for t in m.state_dict().values())\n"
        "assert 'sqlalchemy' not in sys.modules, [n for n in sys.modules if n.startswith('sqlalchemy')]\n"
    )
    env = {**os.environ, "ZOO_REGISTRY": fresh_url.removeprefix("sqlite:///"), "ZOO_CACHE": str(tmp_path / "zc")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def test_timm_prefers_safetensors_when_the_repo_has_both(caches, fresh_url, tmp_path):
    """A repo with model.safetensors and pytorch_model.bin (different values here): timm reads the
    safetensors file, and so does zoo."""
    import timm

    import zoo

    hub_cache, _ = caches
    tag = "resnet18.a1_in1k"
    hub_file(hub_cache, f"timm/{tag}", "pytorch_model.bin", pickle_bytes(seeded_state("resnet18", 11), tmp_path))
    hub_file(hub_cache, f"timm/{tag}", "model.safetensors", safetensors_bytes(seeded_state("resnet18", 12)))
    add_row(fresh_url, f"timm/{tag}", "timm", tag, tag="a1_in1k")
    ours = zoo.connect(fresh_url).get(f"timm/{tag}", weights="pretrained")
    assert_bitwise(ours, timm.create_model(tag, pretrained=True))
    assert torch.equal(ours.fc.bias, seeded_state("resnet18", 12)["fc.bias"])


def test_timm_tag_with_only_a_url_loads_from_torch_hub_cache(caches, fresh_url, tmp_path, monkeypatch):
    """gcvit_xxtiny.in1k has no hub repository: timm downloads its URL into torch hub's cache (the file
    name carries a sha256 prefix, which timm does not check by default and zoo does)."""
    import timm

    import zoo

    _, checkpoints = caches
    tag = "gcvit_xxtiny.in1k"
    assert timm.models.get_pretrained_cfg(tag).hf_hub_id is None  # timm's published cfg: a URL only
    staged = tmp_path / "staged.pth"
    torch.save(seeded_state("gcvit_xxtiny", 13), staged)
    name = f"gcvit_xxtiny_224_nvidia-{hashlib.sha256(staged.read_bytes()).hexdigest()[:8]}.pth"
    checkpoints.mkdir(parents=True)
    shutil.move(staged, checkpoints / name)
    cfg_url = timm.models.get_pretrained_cfg(tag).url
    from timm.models import _registry

    # the stand-in cannot carry the published file's prefix: timm's registered cfg names the stand-in's file,
    # from before the row is indexed (the row records timm's load arguments, this cfg among them)
    monkeypatch.setattr(_registry._model_pretrained_cfgs[tag], "url", cfg_url.rsplit("/", 1)[0] + "/" + name)
    add_row(fresh_url, f"timm/{tag}", "timm", tag, tag="in1k")
    ours = zoo.connect(fresh_url).get(f"timm/{tag}", weights="pretrained")
    assert_bitwise(ours, timm.create_model(tag, pretrained=True))


def test_timm_architecture_row_loads_the_default_tag(caches, fresh_url, tmp_path):
    """weights="pretrained" on an architecture row: what timm.create_model(name, pretrained=True) loads,
    its default tag (resnet18 -> resnet18.a1_in1k, first in timm's list)."""
    import timm

    import zoo

    hub_cache, _ = caches
    assert timm.models.get_pretrained_cfg("resnet18").tag == "a1_in1k"  # timm's published default
    hub_file(hub_cache, "timm/resnet18.a1_in1k", "model.safetensors", safetensors_bytes(seeded_state("resnet18", 6)))
    add_row(fresh_url, "timm/resnet18", "timm", "resnet18")
    m = zoo.connect(fresh_url).get("timm/resnet18")
    assert m.materialize(weights="pretrained") is m
    assert_bitwise(m, timm.create_model("resnet18", pretrained=True))


def test_timm_new_head_keeps_the_published_body(caches, fresh_url):
    """num_classes=10 on a 1000-class tag: timm drops the published classifier (strict=False) and keeps
    the rest; zoo loads the same body, and the new head gets its constructor's values."""
    import timm

    import zoo

    hub_cache, _ = caches
    hub_file(hub_cache, "timm/resnet18.a1_in1k", "model.safetensors", safetensors_bytes(seeded_state("resnet18", 16)))
    add_row(fresh_url, "timm/resnet18.a1_in1k", "timm", "resnet18.a1_in1k", tag="a1_in1k")
    ours = zoo.connect(fresh_url).get("timm/resnet18.a1_in1k", weights="pretrained", num_classes=10)
    theirs = timm.create_model("resnet18.a1_in1k", pretrained=True, num_classes=10)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and a["fc.weight"].shape == (10, 512)
    for k in a:
        if not k.startswith("fc."):
            assert torch.equal(a[k], b[k]), k


def test_weights_timm_loads_with_model_code_are_refused_clearly(caches, fresh_url, monkeypatch):
    """A tag whose weights timm gets by URL with custom_load (the model's own .npz loader) cannot be
    loaded in place: a clear error, no silent fallback. No tag is so today (each has a hub copy), so
    the registered cfg of one is made so."""
    from timm.models import _registry

    import zoo

    tag = "vit_small_patch16_224.augreg_in21k"
    cfg = _registry._model_pretrained_cfgs[tag]
    assert cfg.custom_load and cfg.url.endswith(".npz")  # timm's published cfg
    monkeypatch.setattr(cfg, "hf_hub_id", None)
    add_row(fresh_url, f"timm/{tag}", "timm", tag, tag="augreg_in21k")
    m = zoo.connect(fresh_url).get(f"timm/{tag}")
    with pytest.raises(zoo.CheckpointError, match="cannot be loaded in place"):
        m.materialize(weights="pretrained")
    assert on_meta(m)


def test_a_corrupt_or_truncated_hub_file_is_refused_and_nothing_loads(caches, fresh_url, tmp_path):
    """Also after a good load: the remembered check is of the file as it was, not of its name."""
    import zoo

    hub_cache, _ = caches
    data = safetensors_bytes(seeded_state("resnet18", 7))
    link = hub_file(hub_cache, "timm/resnet18.a1_in1k", "model.safetensors", data)
    add_row(fresh_url, "timm/resnet18.a1_in1k", "timm", "resnet18.a1_in1k", tag="a1_in1k")
    registry = zoo.connect(fresh_url)
    registry.get("timm/resnet18.a1_in1k", weights="pretrained")  # checked once, and remembered (ZOO_CACHE)
    blob = Path(os.path.realpath(link))
    for damaged in (data[: len(data) // 2], data[:-1] + bytes([data[-1] ^ 1])):  # truncated; one bit flipped
        blob.write_bytes(damaged)
        m = registry.get("timm/resnet18.a1_in1k")
        with pytest.raises(zoo.CheckpointError, match="sha256"):
            m.materialize(weights="pretrained")
        assert on_meta(m)


def test_offline_and_not_cached_is_a_clear_error(caches, fresh_url):
    import zoo

    add_row(fresh_url, "timm/resnet18.a1_in1k", "timm", "resnet18.a1_in1k", tag="a1_in1k")
    m = zoo.connect(fresh_url).get("timm/resnet18.a1_in1k")
    with pytest.raises(zoo.HubUnavailable, match="HF_HUB_OFFLINE"):
        m.materialize(weights="pretrained")
    assert on_meta(m)


# --- torchvision through TORCH_HOME -------------------------------------------------------------------


def tv_state(builder: str, seed: int) -> dict:
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.get_model(builder)
    g = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
        for k, v in model.state_dict().items()
    }


def test_torchvision_variant_loads_bitwise_as_get_model_does(caches, fresh_url, tmp_path, monkeypatch):
    """The stand-in cannot carry the published file's sha256 prefix (that would take ~4e9 tries), so the
    weights' URL is pointed at a file name that carries the stand-in's own prefix. Both sides then load
    that one cached file as they always do: torchvision through torch.hub with check_hash=True (its
    real check passes), zoo through its own prefix check."""
    import torchvision

    import zoo

    _, checkpoints = caches
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    staged = tmp_path / "staged.pth"
    torch.save(tv_state("resnet18", 8), staged)
    prefix = hashlib.sha256(staged.read_bytes()).hexdigest()[:8]
    checkpoints.mkdir(parents=True)
    shutil.move(staged, checkpoints / f"resnet18-{prefix}.pth")
    monkeypatch.setattr(weights.value, "url", f"https://download.pytorch.org/models/resnet18-{prefix}.pth")
    add_row(fresh_url, "torchvision/resnet18.IMAGENET1K_V1", "torchvision", "resnet18", tag="IMAGENET1K_V1")
    ours = zoo.connect(fresh_url).get("torchvision/resnet18.IMAGENET1K_V1", weights="pretrained")
    theirs = torchvision.models.get_model("resnet18", weights=weights)
    assert_bitwise(ours, theirs)


def test_torchvision_spellings_of_weights_load_what_get_model_loads(caches, fresh_url, tmp_path, monkeypatch):
    """On a torchvision architecture row, weights="DEFAULT", a weights name and a WeightsEnum member mean
    the published weights, as torchvision.models.get_model(name, weights=...) takes them (they were taken
    for a file or tag before); another model's enum member is refused before anything loads."""
    import torchvision

    import zoo

    _, checkpoints = caches
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1  # resnet18's DEFAULT
    staged = tmp_path / "staged.pth"
    torch.save(tv_state("resnet18", 9), staged)
    prefix = hashlib.sha256(staged.read_bytes()).hexdigest()[:8]
    checkpoints.mkdir(parents=True)
    shutil.move(staged, checkpoints / f"resnet18-{prefix}.pth")
    monkeypatch.setattr(weights.value, "url", f"https://download.pytorch.org/models/resnet18-{prefix}.pth")
    add_row(fresh_url, "torchvision/resnet18", "torchvision", "resnet18")
    registry = zoo.connect(fresh_url)
    for spelling in ("DEFAULT", "IMAGENET1K_V1", weights):
        ours = registry.get("torchvision/resnet18", weights=spelling)
        assert_bitwise(ours, torchvision.models.get_model("resnet18", weights=spelling))
    m = registry.get("torchvision/resnet18")
    with pytest.raises(zoo.InvalidArgument, match="ResNet18_Weights"):
        m.materialize(weights=torchvision.models.ResNet50_Weights.IMAGENET1K_V2)
    assert on_meta(m)


def _old_densenet_keys(state: dict) -> dict:
    """densenet's state as the published files hold it: keys of an older layout (norm.1, conv.2), which
    torchvision renames on load, and no num_batches_tracked (older than that buffer: torch's BatchNorm
    fills it in on load)."""
    return {
        re.sub(r"(denselayer\d+\.(?:norm|relu|conv))([12])\.(weight|bias|running_mean|running_var)$", r"\1.\2.\3", k): v
        for k, v in state.items()
        if not k.endswith("num_batches_tracked")
    }


def test_torchvision_densenet_keys_are_renamed_as_torchvision_does(caches, fresh_url, tmp_path, monkeypatch):
    import torchvision

    import zoo

    _, checkpoints = caches
    weights = torchvision.models.DenseNet121_Weights.IMAGENET1K_V1
    staged = tmp_path / "staged.pth"
    state = _old_densenet_keys(tv_state("densenet121", 14))
    assert "features.denseblock1.denselayer1.norm.1.weight" in state
    torch.save(state, staged)
    name = f"densenet121-{hashlib.sha256(staged.read_bytes()).hexdigest()[:8]}.pth"
    checkpoints.mkdir(parents=True)
    shutil.move(staged, checkpoints / name)
    monkeypatch.setattr(weights.value, "url", f"https://download.pytorch.org/models/{name}")
    add_row(fresh_url, "torchvision/densenet121.IMAGENET1K_V1", "torchvision", "densenet121", tag="IMAGENET1K_V1")
    ours = zoo.connect(fresh_url).get("torchvision/densenet121.IMAGENET1K_V1", weights="pretrained")
    assert_bitwise(ours, torchvision.models.get_model("densenet121", weights=weights))


def test_torchvision_googlenet_drops_the_aux_heads_its_file_holds_as_torchvision_does(
    caches, fresh_url, tmp_path, monkeypatch
):
    import torchvision

    import zoo
    from zoo.families.torchvision import variants

    _, checkpoints = caches
    weights = torchvision.models.GoogLeNet_Weights.IMAGENET1K_V1
    staged = tmp_path / "staged.pth"
    state = tv_state("googlenet", 15)  # the builder's default aux_logits=True: the published file's keys
    assert any(k.startswith("aux1.") for k in state)
    torch.save(state, staged)
    name = f"googlenet-{hashlib.sha256(staged.read_bytes()).hexdigest()[:8]}.pth"
    checkpoints.mkdir(parents=True)
    shutil.move(staged, checkpoints / name)
    monkeypatch.setattr(weights.value, "url", f"https://download.pytorch.org/models/{name}")
    (variant,) = variants(["googlenet.IMAGENET1K_V1"])
    add_row(
        fresh_url,
        "torchvision/googlenet.IMAGENET1K_V1",
        "torchvision",
        "googlenet",
        tag="IMAGENET1K_V1",
        kwargs=variant["kwargs"],
    )
    ours = zoo.connect(fresh_url).get("torchvision/googlenet.IMAGENET1K_V1", weights="pretrained")
    assert_bitwise(ours, torchvision.models.get_model("googlenet", weights=weights))


def test_quantized_torchvision_weights_are_refused_with_the_way_to_load_them(caches, fresh_url):
    import zoo
    from zoo.errors import CheckpointError

    add_row(
        fresh_url,
        "torchvision/quantized_resnet18.IMAGENET1K_FBGEMM_V1",
        "torchvision",
        "quantized_resnet18",
        tag="IMAGENET1K_FBGEMM_V1",
        kwargs={"quantize": False},
    )
    with pytest.raises(CheckpointError, match="int8.*quantize=True"):
        zoo.connect(fresh_url).get("torchvision/quantized_resnet18.IMAGENET1K_FBGEMM_V1", weights="pretrained")


def test_torchvision_file_not_matching_its_name_prefix_is_refused(caches, fresh_url, tmp_path):
    """The stand-in under the published file name (resnet18-f37072fd.pth): its sha256 does not start with
    f37072fd, so zoo refuses it with torch.hub's check_hash test, and the module stays on meta."""
    import torchvision

    import zoo

    _, checkpoints = caches
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    checkpoints.mkdir(parents=True)
    path = checkpoints / os.path.basename(weights.url)
    torch.save(tv_state("resnet18", 9), path)
    assert not hashlib.sha256(path.read_bytes()).hexdigest().startswith("f37072fd")
    add_row(fresh_url, "torchvision/resnet18.IMAGENET1K_V1", "torchvision", "resnet18", tag="IMAGENET1K_V1")
    m = zoo.connect(fresh_url).get("torchvision/resnet18.IMAGENET1K_V1")
    with pytest.raises(zoo.CheckpointError, match="f37072fd"):
        m.materialize(weights="pretrained")
    assert on_meta(m)
    # (torch.hub checks the prefix only when it downloads: a file already in its cache it trusts as is)


# --- downloads from a local server ------------------------------------------------------------------


class _Server:
    """Serves one file at /NAME with Range support; the first `drops` GETs stop halfway and close the
    connection; `stall` makes GETs send half and then wait (for a download to be killed)."""

    def __init__(self, name: str, data: bytes, drops: int = 0, stall: bool = False):
        self.name, self.data, self.drops, self.stall = name, data, drops, stall
        self.ranges: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != f"/{server.name}":
                    self.send_error(404)
                    return
                rng = self.headers.get("Range")
                server.ranges.append(rng)
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                body = server.data[start:]
                self.send_response(206 if rng else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.drops or server.stall:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    if server.stall:
                        threading.Event().wait(30)
                    server.drops -= 1
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_download_resumes_after_a_dropped_connection_with_progress(tmp_path, capsys):
    from zoo.weights.download import fetch

    data = os.urandom(3 << 20)
    prefix = hashlib.sha256(data).hexdigest()[:8]
    server = _Server(f"w-{prefix}.pth", data, drops=2)
    try:
        dest = fetch(server.url, tmp_path / f"w-{prefix}.pth", prefix)
    finally:
        server.close()
    assert dest.read_bytes() == data
    assert server.ranges[0] is None and server.ranges[1] == f"bytes={(3 << 20) // 2}-"  # resumed, not restarted
    assert not (tmp_path / f"w-{prefix}.pth.partial").exists()
    assert f"w-{prefix}.pth" in capsys.readouterr().err  # the progress bar names the file


def test_a_download_with_the_wrong_hash_places_nothing(tmp_path):
    from zoo.errors import CheckpointError
    from zoo.weights.download import fetch

    server = _Server("w-deadbeef.pth", os.urandom(1 << 16))
    try:
        with pytest.raises(CheckpointError, match="deadbeef"):
            fetch(server.url, tmp_path / "w-deadbeef.pth", "deadbeef", progress=False)
    finally:
        server.close()
    assert list(tmp_path.iterdir()) == []


def test_a_killed_download_leaves_no_file_a_load_would_trust(tmp_path):
    """A download killed mid-transfer leaves only NAME.partial; the cache's NAME appears only after the
    next download completes it (resuming) and its hash checks."""
    from zoo.weights.download import fetch

    data = os.urandom(2 << 20)
    prefix = hashlib.sha256(data).hexdigest()[:8]
    dest = tmp_path / f"w-{prefix}.pth"
    server = _Server(dest.name, data, stall=True)
    code = (
        "import sys; from zoo.weights.download import fetch; "
        "fetch(sys.argv[1], sys.argv[2], sys.argv[3], progress=False)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, server.url, str(dest), prefix],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    partial = dest.with_name(dest.name + ".partial")
    try:
        for _ in range(300):
            if partial.exists() and partial.stat().st_size >= len(data) // 2:
                break
            threading.Event().wait(0.05)
        proc.kill()
        proc.wait()
        assert not dest.exists() and partial.exists()
        server.stall = False
        assert fetch(server.url, dest, prefix, progress=False).read_bytes() == data
        assert server.ranges[-1] == f"bytes={len(data) // 2}-"
    finally:
        server.close()


def test_torchvision_weights_download_into_torch_hub_cache(caches, fresh_url, tmp_path, monkeypatch):
    """Online and not cached: the file is downloaded into $TORCH_HOME/hub/checkpoints under its URL's name,
    where torchvision then finds it (it is not asked to download anything)."""
    import torchvision
    from huggingface_hub import constants

    import zoo

    _, checkpoints = caches
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    staged = tmp_path / "staged.pth"
    torch.save(tv_state("resnet18", 10), staged)
    data = staged.read_bytes()
    name = f"resnet18-{hashlib.sha256(data).hexdigest()[:8]}.pth"
    server = _Server(name, data)
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    monkeypatch.setattr(weights.value, "url", server.url)
    add_row(fresh_url, "torchvision/resnet18.IMAGENET1K_V1", "torchvision", "resnet18", tag="IMAGENET1K_V1")
    try:
        ours = zoo.connect(fresh_url).get("torchvision/resnet18.IMAGENET1K_V1", weights="pretrained")
    finally:
        server.close()  # torchvision below must find the file in the cache
    assert (checkpoints / name).read_bytes() == data
    assert_bitwise(ours, torchvision.models.get_model("resnet18", weights=weights))


class _Hub(BaseHTTPRequestHandler):
    """The few answers of the Hugging Face hub that huggingface_hub's download needs: HEAD and GET of
    /REPO/resolve/REVISION/FILE with the commit and the LFS sha256 as ETag; 404 EntryNotFound otherwise."""

    files: dict = {}  # (repo, filename) -> bytes
    commit = "c" * 40
    gets: list = []

    def log_message(self, *args):
        pass

    def _lookup(self):
        match = re.fullmatch(r"/(.+)/resolve/([^/]+)/(.+)", self.path.split("?")[0])
        return self.files.get((match.group(1), match.group(3))) if match else None

    def _head(self, data):
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        sha = hashlib.sha256(data).hexdigest()
        self.send_response(200)
        for key, value in (
            ("X-Repo-Commit", self.commit),
            ("ETag", f'"{sha}"'),
            ("X-Linked-Etag", f'"{sha}"'),
            ("X-Linked-Size", str(len(data))),
            ("Content-Length", str(len(data))),
        ):
            self.send_header(key, value)
        self.end_headers()
        return True

    def do_HEAD(self):
        self._head(self._lookup())

    def do_GET(self):
        data = self._lookup()
        type(self).gets.append(self.path)
        if self._head(data):
            self.wfile.write(data)


def test_timm_weights_download_into_the_hub_cache(caches, fresh_url, monkeypatch, capsys):
    """Online and not cached: huggingface_hub downloads the file (its progress bar) into the hub cache
    layout, where timm then finds it offline, and both builds are bitwise equal."""
    import timm
    from huggingface_hub import constants

    import zoo

    hub_cache, _ = caches
    tag = "resnet18.a1_in1k"
    _Hub.files = {(f"timm/{tag}", "model.safetensors"): safetensors_bytes(seeded_state("resnet18", 15))}
    _Hub.gets = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("TQDM_POSITION", "-1")  # huggingface_hub shows its bar off a terminal too
    add_row(fresh_url, f"timm/{tag}", "timm", tag, tag="a1_in1k")
    try:
        ours = zoo.connect(fresh_url).get(f"timm/{tag}", weights="pretrained")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [g for g in _Hub.gets if "/resolve/" in g] == [f"/timm/{tag}/resolve/main/model.safetensors"]
    assert "model.safetensors" in capsys.readouterr().err  # huggingface_hub's progress bar
    sha = hashlib.sha256(_Hub.files[(f"timm/{tag}", "model.safetensors")]).hexdigest()
    repo = hub_cache / f"models--timm--{tag}"
    assert (repo / "blobs" / sha).is_file() and (repo / "refs" / "main").read_text() == _Hub.commit
    assert (repo / "snapshots" / _Hub.commit / "model.safetensors").resolve() == (repo / "blobs" / sha).resolve()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # timm reads what zoo downloaded, offline
    assert_bitwise(ours, timm.create_model(tag, pretrained=True))
