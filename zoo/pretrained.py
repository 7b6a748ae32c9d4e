"""weights="pretrained": a library's published weights for a model, found in that library's own cache.

timm: the Hugging Face hub cache (HF_HOME, HF_HUB_OFFLINE honoured; huggingface_hub downloads with its
progress bar when online), or torch hub's checkpoint cache for the few tags that have only a URL.
torchvision: torch hub's checkpoint cache ($TORCH_HOME/hub/checkpoints/FILE). So a file zoo fetched
is one timm and torchvision find, and the other way round.

The result is the state timm.create_model(tag, pretrained=True) and torchvision.models.get_model(name,
weights=W) give from the same files: timm's own arguments to load_pretrained (its per-model checkpoint
filter, the classifier handling, strictness) are caught from a meta build with pretrained=True and
remembered (zoo.families.timm_loader), and replayed here. The filter runs first on meta tensors: what it passes through
unchanged (the bulk of a checkpoint) is read straight from the file into the model's new memory; only what it computes
(a resampled position embedding, a reshaped kernel) is computed, by the filter itself, on real values.
Formats timm loads with a model's own code (.npz through custom_load) are refused with a clear error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from zoo.errors import CheckpointError, HubUnavailable, InvalidArgument
from zoo.families import family
from zoo.families.timm_loader import timm_load_arguments
from zoo.families.torchvision import weights_of
from zoo.weights.hub import offline
from zoo.weights.placement import box_slices
from zoo.weights.sources import SafetensorsSource, Source, Spec, TensorDictSource, is_pickle, load_pickle


def published_tag(recipe, weights):
    """The published weights that `weights` names: None for "pretrained" (the row's own); a torchvision
    tag for torchvision's own spellings (zoo.families.torchvision.weights_tag); False when it names none
    (a file, a recorded tag, hf://...)."""
    if isinstance(weights, str) and weights == "pretrained":
        return None
    if recipe is None:
        return False
    return family(recipe.family).weights_tag(recipe.builder, weights)


def pretrained_source(recipe, tag: str | None, module, recorded: dict | None = None) -> tuple[Source, bool]:
    """(source, strict) to load `module` (built from `recipe`, on meta) with its library's published weights.
    tag: the weights tag of a variant row (torchvision's "IMAGENET1K_V2"); None for an architecture row,
    which gets the library's default weights (timm: create_model(name, pretrained=True); torchvision: DEFAULT).
    recorded: the row's load_args (zoo.families.timm_loader), used when they are for this very builder."""
    if recipe is None:
        raise InvalidArgument("weights='pretrained' needs the model's recipe: get the module with zoo.get")
    kind = family(recipe.family).PRETRAINED  # where its library publishes weights (zoo.families.base)
    if kind == "timm-cfg":  # a variant's builder is its full tag; a bare one gets the row's tag
        builder = recipe.builder if "." in recipe.builder or not tag else f"{recipe.builder}.{tag}"
        return timm_source(builder, recipe.kwargs, module, recorded if builder == recipe.builder else None)
    if kind == "weights-enum":
        return torchvision_source(recipe.builder, tag, module)
    raise InvalidArgument(
        f"weights='pretrained' is for timm and torchvision models, not {recipe.family} ones; "
        f"give a file, a recorded tag or hf://ORG/NAME"
    )


# --- torch hub's checkpoint cache ----------------------------------------------------------------


def torch_hub_file(url: str, progress: bool = True) -> Path:
    """The cached file of a URL in torch hub's checkpoint cache, downloaded when missing (unless
    HF_HUB_OFFLINE is set: zoo's one switch for "no network"), its sha256 checked against the prefix
    in its name with torch.hub's test. torch.hub applies that test only to what it downloads; zoo to a
    file already in the cache too (once per file state, see zoo.weights.verified)."""
    import torch.hub

    name = os.path.basename(url.split("?")[0])
    path = Path(torch.hub.get_dir()) / "checkpoints" / name
    prefix = hash_prefix(name)
    if not path.exists():
        if offline():
            raise HubUnavailable(
                f"{path}: not in torch hub's cache and HF_HUB_OFFLINE is set; put the file from "
                f"{url} there, or unset HF_HUB_OFFLINE"
            )
        from zoo.weights.download import fetch

        fetch(url, path, prefix, progress)
    check_prefix(path, prefix)
    return path


def hash_prefix(file_name: str) -> str | None:
    """The sha256 prefix torch.hub reads in a published file's name (resnet18-f37072fd.pth)."""
    from torch.hub import HASH_REGEX

    match = HASH_REGEX.search(file_name)
    return match.group(1) if match else None


def check_prefix(path: Path, prefix: str | None) -> None:
    """CheckpointError unless the file's sha256 starts with prefix (torch.hub.check_hash's test)."""
    from zoo.weights import verified
    from zoo.weights.digest import file_sha256

    if not prefix or verified.known(path, prefix):
        return
    actual = file_sha256(path)
    if not actual.startswith(prefix):
        raise CheckpointError(
            f"{path}: sha256 {actual} does not start with {prefix}, the prefix its name "
            f"carries; the cached file is corrupt (delete it to download it again)"
        )
    verified.remember(path, prefix)


# --- torchvision -----------------------------------------------------------------------------------

# densenet's published files use the keys of an older module layout ("norm.1"); torchvision's
# densenet._load_state_dict renames them with this pattern before loading, and so does zoo.
_DENSENET_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$"
)


def torchvision_source(builder: str, tag: str | None, module) -> tuple[Source, bool]:
    if builder.startswith("quantized_"):
        raise CheckpointError(
            f"{builder}'s weights are int8, packed for a quantized model that cannot be built "
            f"on meta; its row sizes the float model they came from. Load them with "
            f"torchvision.models.get_model({builder!r}, weights=..., quantize=True)"
        )
    weights = weights_of(builder, tag)
    tensors = load_pickle(torch_hub_file(weights.url))  # weights_only, memory-mapped
    if builder.startswith("densenet"):
        tensors = {_DENSENET_KEY.sub(r"\1\2", k): v for k, v in tensors.items()}
    source = TensorDictSource(tensors)
    # googlenet's file holds aux heads that its builder loads and then drops (aux_logits=False): so does zoo
    drop = {k for k in source.specs if k.startswith(("aux1.", "aux2.")) and getattr(module, "aux1", None) is None}
    return batchnorm_counts(_Edited(source, drop, {}) if drop else source, module), True


def batchnorm_counts(source: Source, module) -> Source:
    """Files saved before BatchNorm had num_batches_tracked lack it; torch's BatchNorm load fills it in
    (with 0 here: the count of a module built on meta), and zoo does the same."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    missing = {
        f"{name}.num_batches_tracked": torch.tensor(0, dtype=torch.long)
        for name, m in module.named_modules()
        if isinstance(m, _BatchNorm)
        and getattr(m, "num_batches_tracked", None) is not None
        and f"{name}.num_batches_tracked" not in source.specs
    }
    return _Edited(source, set(), missing) if missing else source


# --- timm ----------------------------------------------------------------------------------------


def timm_source(builder: str, kwargs: dict, module, recorded: dict | None = None) -> tuple[Source, bool]:
    args = timm_load_arguments(builder, kwargs, recorded, module)
    cfg = args["cfg"]
    name = f"{cfg.get('architecture', builder)}.{cfg.get('tag')}" if cfg.get("tag") else builder
    # timm calls a model's own loader for custom_load weights it gets by URL (or as a hub file with
    # custom_load="hf"); weights it gets from the hub otherwise go through the ordinary state-dict path
    custom = cfg.get("custom_load")
    if custom and (not cfg.get("hf_hub_id") or (custom == "hf" and cfg.get("hf_hub_filename"))):
        raise CheckpointError(
            f"timm {name}: timm loads these weights with the model's own load_pretrained "
            f"({cfg.get('url') or cfg.get('hf_hub_id')}, e.g. a JAX .npz): they cannot be "
            f"loaded in place; use timm.create_model({name!r}, pretrained=True)"
        )
    path, check = timm_file(cfg, name)
    if path.name.endswith(".safetensors"):
        pending = _in_background(check)
        try:
            checked = _CheckedWhileRead([path], pending)
        except BaseException:
            pending.result()  # a corrupt file: its hash says so more plainly than its header does
            raise
        try:
            source = _filtered_file(checked, args, module)
        except BaseException:
            checked.close()
            raise
    elif is_pickle(path):
        check()  # a pickle is not even unpickled before its hash checks
        tensors = _call_filter(args["filter_fn"], load_pickle(path), module)  # weights_only, memory-mapped
        source = TensorDictSource(tensors)
    else:
        raise CheckpointError(f"{path}: timm {name}'s weights are in a format zoo does not read in place")
    return _finish(source, args, module)


def timm_file(cfg: dict, name: str) -> tuple[Path, Callable[[], None]]:
    """The cached checkpoint file timm would load for this pretrained cfg (downloaded if online and
    missing), and the check of its hash to run before its values are committed (CheckpointError on a
    mismatch): the hub's sha256 for an LFS file (the cached blob's name). A URL's file (torch hub's
    cache) is checked against the prefix in its name before it is returned."""
    hub_id = cfg.get("hf_hub_id")
    if hub_id:
        from zoo.weights.hub import _check_hashes, download

        repo, _, revision = hub_id.partition("@")
        for filename in _hub_candidates(cfg.get("hf_hub_filename") or "pytorch_model.bin"):
            path = download(repo, filename, revision or None, missing_ok=True)
            if path is not None:
                return Path(path), lambda path=path: _check_hashes(f"hf://{hub_id}", repo, [path])
        where = "the local cache (HF_HUB_OFFLINE is set)" if offline() else "the repository"
        raise HubUnavailable(f"timm {name}: no weights file of {hub_id} in {where}")
    if cfg.get("url"):
        return torch_hub_file(cfg["url"]), lambda: None
    raise CheckpointError(f"timm {name}: its pretrained cfg names no hub repository or URL")


def _in_background(check):
    """The hash check on a thread of its own (hashlib releases the GIL), while the file is read."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, thread_name_prefix="zoo-hash")
    try:
        return pool.submit(check)
    finally:
        pool.shutdown(wait=False)


class _CheckedWhileRead(SafetensorsSource):
    """A safetensors file read while its hash is checked. close() waits for the check and raises its
    CheckpointError: materialize closes its source before it commits anything (a load is a
    transaction), so values read from a file that fails the check are dropped, never swapped in.
    The file's header and offsets are validated as for any untrusted file before anything is read."""

    def __init__(self, files, pending):
        self.pending = None  # a header the base class refuses closes the source: nothing to wait for there
        super().__init__(files)
        self.pending = pending

    def close(self) -> None:
        super().close()
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()


def _hub_candidates(filename: str) -> list[str]:
    """timm's order: a .safetensors name alone; else its safetensors alternatives first, then the name."""
    if filename.endswith(".safetensors"):
        return [filename]
    from timm.models._hub import _get_safe_alternatives

    return [*_get_safe_alternatives(filename), filename]


def _call_filter(filter_fn, state_dict: dict, module) -> dict:
    if filter_fn is None:
        return state_dict
    try:
        return filter_fn(state_dict, module)
    except TypeError:  # timm's own fallback: filters of one argument
        return filter_fn(state_dict)


class FilteredSource(Source):
    """A checkpoint as timm's filter leaves it: keys passed through (renamed or not) are read from the
    file; keys the filter computed hold their tensors."""

    def __init__(self, file: SafetensorsSource, renamed: dict[str, str], computed: dict):
        self.file, self.renamed, self.computed = file, renamed, computed
        self.specs = {k: file.specs[v] for k, v in renamed.items()}
        self.specs.update(TensorDictSource(computed).specs if computed else {})

    def read_into(self, name, dest, box=None) -> None:
        if name in self.renamed:
            self.file.read_into(self.renamed[name], dest, box)
        else:
            src = self.computed[name]
            dest.copy_(src if box is None else src[box_slices(box)])

    def close(self) -> None:
        self.file.close()


def _filtered_file(source: SafetensorsSource, args: dict, module) -> Source:
    """The filter replayed without reading what it passes through (see the module's docstring)."""
    import torch

    def meta(spec: Spec):
        return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device="meta")

    def read(key: str):
        spec = source.specs[key]
        t = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
        source.read_into(key, t)
        return t

    filter_fn = args["filter_fn"]
    if filter_fn is None:
        return source
    shapes = {k: meta(s) for k, s in source.specs.items()}
    try:
        out = _call_filter(filter_fn, dict(shapes), module)
    except Exception:  # a filter that needs values (data-dependent): it runs on the real checkpoint
        out = None
    if out is not None:
        origin = {id(v): k for k, v in shapes.items()}
        renamed = {k: origin[id(v)] for k, v in out.items() if id(v) in origin}
        rest = [k for k in out if k not in renamed]
        if not rest and renamed == {k: k for k in source.specs}:
            return source  # the file as it is: on CUDA it streams, and copy=False can view it
        if not rest:
            return FilteredSource(source, renamed, {})
        used = set(renamed.values())  # second run: real values for everything not passed through
        again = _call_filter(filter_fn, {k: shapes[k] if k in used else read(k) for k in source.specs}, module)
        if again.keys() == out.keys() and all(not again[k].is_meta for k in rest):
            return FilteredSource(source, renamed, {k: again[k] for k in rest})
    # the filter's computed values depend on passed-through ones: it runs once on every real value
    return FilteredSource(source, {}, dict(_call_filter(filter_fn, {k: read(k) for k in source.specs}, module)))


def _finish(source: Source, args: dict, module) -> tuple[Source, bool]:
    """timm's load_pretrained after the filter: the input-channel check and the classifier handling."""
    cfg, strict = args["cfg"], args["strict"]
    pretrained_in_chans = (cfg.get("input_size") or (3,))[0]
    if args["in_chans"] != pretrained_in_chans:
        source.close()
        raise InvalidArgument(
            f"in_chans={args['in_chans']}: timm adapts the first convolution of weights trained "
            f"on {pretrained_in_chans} channels; zoo loads published weights only as published"
        )
    classifiers = cfg.get("classifier")
    classifiers = (classifiers,) if isinstance(classifiers, str) else classifiers or ()
    label_offset = cfg.get("label_offset", 0)
    drop, sliced = set(), {}
    if classifiers and args["num_classes"] != cfg.get("num_classes"):
        drop = {f"{c}.{p}" for c in classifiers for p in ("weight", "bias")}  # a new head: not loaded
        strict = False
    elif classifiers and label_offset > 0:
        for key in (f"{c}.{p}" for c in classifiers for p in ("weight", "bias")):
            import torch

            spec = source.specs[key]
            full = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
            source.read_into(key, full)
            sliced[key] = full[label_offset:]
    if drop or sliced:
        source = _Edited(source, drop, sliced)
    return batchnorm_counts(source, module), strict


class _Edited(Source):
    """A source with some keys dropped and some replaced by tensors (timm's classifier handling)."""

    def __init__(self, inner: Source, drop: set, replaced: dict):
        self.inner, self.replaced = inner, replaced
        self.specs = {k: v for k, v in inner.specs.items() if k not in drop}
        self.specs.update(TensorDictSource(replaced).specs if replaced else {})

    def read_into(self, name, dest, box=None) -> None:
        if name in self.replaced:
            src = self.replaced[name]
            dest.copy_(src if box is None else src[box_slices(box)])
        else:
            self.inner.read_into(name, dest, box)

    def close(self) -> None:
        self.inner.close()
