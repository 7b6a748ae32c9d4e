"""The one declaration of a model's recorded fields: the registry table, ModelInfo, the search fields
and the analysis result are all derived from COLUMNS (migrations, being history, spell out their own).

Pure data: importing it imports neither torch nor SQLAlchemy.
"""

import json
import math
import numbers
import re

from zoo.records import Record


class Column(Record):
    __slots__ = (
        "name",
        "kind",
        "doc",
        "size",
        "wide",
        "nullable",
        "indexed",
        "unique",
        "searchable",
        "unit",
        "public",
        "analysis",
        "default",
    )
    name: str
    kind: str  # "text", "int", "float", "json" (JSON text), "shape" (JSON list, read as a tuple), "datetime"
    doc: str
    size: int | None  # text and JSON: a VARCHAR of this many characters; None: unbounded TEXT
    wide: bool  # int: 64-bit
    nullable: bool
    indexed: bool
    unique: bool
    searchable: bool
    unit: str | None  # of a number: "elements", "bytes", "FLOPs", ...
    public: bool  # an attribute of ModelInfo
    analysis: bool  # filled by the index-time analysis (zoo.analysis), not by the build
    default: str | None  # what an insert that leaves it out stores

    def __init__(
        self,
        name: str,
        kind: str,
        doc: str,
        size: int | None = None,
        wide: bool = True,
        nullable: bool = True,
        indexed: bool = False,
        unique: bool = False,
        searchable: bool = False,
        unit: str | None = None,
        public: bool = True,
        analysis: bool = False,
        default: str | None = None,
    ):
        self._init(name, kind, doc, size, wide, nullable, indexed, unique, searchable, unit, public, analysis, default)

    @property
    def search_type(self) -> str:
        """What the search grammar compares it as: "number" or "string"."""
        return "number" if self.kind in ("int", "float") else "string"

    def python_type(self):
        from datetime import datetime  # here, not at the top: every search imports zoo.columns

        base = {"text": str, "int": int, "float": float, "json": object, "shape": tuple, "datetime": datetime}[
            self.kind
        ]
        return base | None if self.nullable else base

    def decode(self, value):
        """The registry's stored value as ModelInfo holds it; a number column's value that is not a finite number
        (text or inf that SQLite took, PostgreSQL's NaN, put there by hand) reads as missing."""
        if value is None:  # most of a row's fields (a search's 100 rows hold 9,000 values): no kind checks
            return {} if self.kind == "json" and not self.nullable else None
        if self.kind == "json":
            return loads(value) if value else (None if self.nullable else {})
        if self.kind == "shape":
            return tuple(loads(value)) if value else None
        if self.kind in ("int", "float"):
            return finite(value)
        return value

    def encode(self, value):
        """A Python value as the registry stores it."""
        if value is None or self.kind not in ("json", "shape"):
            return value
        try:  # NaN and Infinity are not JSON: no reader but Python's would parse the field
            # the separators the shipped registry was written with, so that a rebuild compares equal
            return (
                json.dumps(list(value), allow_nan=False)
                if self.kind == "shape"
                else json.dumps(value, separators=(",", ":"), allow_nan=False)
            )
        except ValueError:
            from zoo.errors import InvalidArgument

            raise InvalidArgument(
                f"{self.name} holds a number that is not finite (NaN or infinity): "
                f"{str(value)[:200]}; give a finite number or none"
            ) from None


def finite(value):
    """`value` if it is a finite real number (int, float, a numpy scalar), else None: what a reader makes of a stored
    number that is not one (so one bad value can neither break a page's JSON nor a format)."""
    if type(value) is int:  # most values: no ABC check (a search's 100 rows hold 3,000 numbers)
        return value
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return value if math.isfinite(value) else None


def loads(text: str):
    """JSON as zoo reads it from the registry: a NaN or Infinity in it (Python's json writes them) as null."""
    return json.loads(text, parse_constant=lambda constant: None)


# Measured throughput, one column per hardware and mode, named MODE_HARDWARE_PRECISION (each with a _batch twin):
# hardware measured later is one more entry here, a migration and a file in zoo.families.timm.BENCHMARKS.
THROUGHPUT = {
    "infer_4090_amp": "inference on an RTX 4090, AMP, NCHW (PyTorch 2.9.1, CUDA 12.8)",
    "infer_5090_amp": "inference on an RTX 5090, AMP, NCHW (PyTorch 2.9.1, CUDA 13.0)",
    "infer_pro6000_amp": "inference on an RTX PRO 6000 Max-Q, AMP, NCHW (PyTorch 2.9.1, CUDA 13.0)",
    "infer_i7_12700h_fp32": "inference on an Intel i7-12700H CPU, fp32, torch.compile, batch 1 (PyTorch 2.4.0)",
    "train_3090_amp": "training steps on an RTX 3090, AMP (PyTorch 1.12, CUDA 11.3)",
}

COLUMNS: tuple[Column, ...] = (
    Column(
        "name",
        "text",
        "full name: family/builder, e.g. timm/resnet50",
        size=255,
        nullable=False,
        unique=True,
        searchable=True,
    ),
    Column(
        "short",
        "text",
        "the name without its family, for bare-name lookups",
        size=255,
        nullable=False,
        indexed=True,
        searchable=True,
        public=False,
    ),
    Column(
        "family",
        "text",
        "timm, torchvision, hf, user or checkpoint",
        size=32,
        nullable=False,
        indexed=True,
        searchable=True,
    ),
    Column(
        "builder",
        "text",
        "family-specific: timm model name, pkg.mod:fn, auto class, file path",
        size=255,
        nullable=False,
        searchable=True,
    ),
    Column("kwargs", "json", "the recipe's keyword arguments (a JSON object)", nullable=False, default="{}"),
    Column(
        "arch", "text", "the module's class, e.g. timm.models.resnet.ResNet", size=255, indexed=True, searchable=True
    ),
    Column("task", "text", "hub pipeline name, e.g. image-classification", size=64, indexed=True, searchable=True),
    Column("input_size", "shape", "documented input without the batch, e.g. [3, 224, 224]", size=64),
    Column("versions", "json", "library versions that built it, e.g. {torch, timm}", nullable=False, default="{}"),
    Column("dtype", "text", "dtype of most parameter bytes", size=32, searchable=True),
    Column("params", "int", "parameter elements, tied tensors once", indexed=True, searchable=True, unit="elements"),
    Column("trainable", "int", "parameter elements that require grad", searchable=True, unit="elements"),
    Column("buffers", "int", "buffer elements", searchable=True, unit="elements"),
    Column("tensors", "int", "distinct parameter and buffer tensors", wide=False, searchable=True, unit="tensors"),
    Column("param_bytes", "int", "bytes of parameters", searchable=True, unit="bytes"),
    Column("buffer_bytes", "int", "bytes of buffers", searchable=True, unit="bytes"),
    Column("bytes", "int", "bytes of parameters and buffers", indexed=True, searchable=True, unit="bytes"),
    Column(
        "status", "text", "ok, or error when the build failed", size=16, nullable=False, indexed=True, searchable=True
    ),
    Column("error", "text", "why the build failed"),
    Column(
        "source_hash",
        "text",
        "recipe + library versions: unchanged means not rebuilt",
        size=64,
        nullable=False,
        public=False,
    ),
    Column("indexed_at", "datetime", "when it was recorded (UTC)", nullable=False),
    Column(
        "structure_digest",
        "text",
        "zoo.structure digest of the build and its analysis input: equal digests share one analysis",
        size=64,
        indexed=True,
        public=False,
    ),
    Column(
        "flops",
        "int",
        "inference FLOPs at batch 1, 2 per multiply-accumulate",
        indexed=True,
        searchable=True,
        unit="FLOPs",
        analysis=True,
    ),
    Column(
        "macs",
        "int",
        "multiply-accumulates at batch 1 (torchvision's 'GFLOPS')",
        searchable=True,
        unit="MACs",
        analysis=True,
    ),
    Column(
        "train_activation_bytes",
        "int",
        "bytes autograd saves for backward, training mode, batch 1",
        searchable=True,
        unit="bytes",
        analysis=True,
    ),
    Column(
        "peak_activation_bytes",
        "int",
        "peak live activation bytes, inference, batch 1",
        searchable=True,
        unit="bytes",
        analysis=True,
    ),
    Column("output_shapes", "json", "the output: [[path, shape, dtype], ...]", analysis=True),
    Column(
        "scan_status", "text", "ok, error or no-input; empty: not analysed", size=16, searchable=True, analysis=True
    ),
    Column("scan_error", "text", "why the meta forward failed", analysis=True),
    # Pretrained variants: a row per published weights of an architecture.
    Column(
        "kind",
        "text",
        "architecture, or variant: an architecture with published weights",
        size=16,
        nullable=False,
        indexed=True,
        searchable=True,
        default="architecture",
    ),
    Column(
        "arch_name",
        "text",
        "the architecture row's name (an architecture's own name)",
        size=255,
        indexed=True,
        searchable=True,
    ),
    Column(
        "tag",
        "text",
        "the weights' tag as the library names it, e.g. a1_in1k, IMAGENET1K_V2",
        size=128,
        searchable=True,
    ),
    Column(
        "license",
        "text",
        "the weights' (or hub repo's) license, e.g. apache-2.0",
        size=64,
        indexed=True,
        searchable=True,
    ),
    Column(
        "dataset", "text", "what the weights were trained on, as published, e.g. ImageNet-1K", size=128, searchable=True
    ),
    Column(
        "num_classes",
        "int",
        "classes of the classifier head the weights carry (0: features)",
        searchable=True,
        unit="classes",
    ),
    Column("weights_bytes", "int", "size of the published weights file", searchable=True, unit="bytes"),
    Column(
        "weights_source",
        "json",
        "where the weights come from: timm {hf_hub_id, hf_hub_filename, url}; "
        "torchvision {url, sha256_prefix (the hex in the file name, as torch.hub checks it), file, and "
        "ignore_prefixes: keys the file holds that the model drops}",
    ),
    Column(
        "preprocess",
        "json",
        "input_size, test_input_size, crop_pct, test_crop_pct, crop_mode, interpolation, "
        "mean, std (timm's pretrained cfg); torchvision: input_size = [3, crop], resize_size, crop_mode center, "
        "crop_pct and test sizes empty",
    ),
    Column(
        "load_args",
        "json",
        "timm: what create_model(NAME, pretrained=True) passes to load_pretrained (the "
        "pretrained cfg, num_classes, in_chans, strict, the checkpoint filter as module:function with its "
        "filter_kwargs) and the timm version that caught it; weights='pretrained' replays it, where it is what "
        "timm would pass, instead of building the model twice",
    ),
    Column(
        "plan_shapes",
        "json",
        "what zoo.plan counts model states from (zoo.planning.shape_groups): parameters grouped by module, leaf and "
        "shape, the buffers' bytes, the largest repeated block",
    ),
    Column(
        "plan_activations",
        "json",
        "activation fits zoo.plan and search --fits read, by mode (zoo.planning.RECORDED_MODES): two regimes' "
        "c0, c1, a, q and the KV cache bytes per token",
        analysis=True,
    ),
    Column("card", "json", "published facts beyond the metrics: paper, recipe, origin, notes"),
    Column("metrics", "json", "every published metric, {dataset: {metric: value}}"),
    Column(
        "top1",
        "float",
        "top-1 accuracy on ImageNet-1k validation, as published",
        indexed=True,
        searchable=True,
        unit="%",
    ),
    Column("top5", "float", "top-5 accuracy on ImageNet-1k validation, as published", searchable=True, unit="%"),
    # timm evaluates some tags twice: at input_size (top1, flops, ... pair) and at a larger test size
    Column(
        "test_top1",
        "float",
        "top-1 on ImageNet-1k validation at test_input_size (timm's larger test size), "
        "where published; top1 is the result at input_size",
        searchable=True,
        unit="%",
    ),
    Column("test_top5", "float", "top-5 at test_input_size, where published", searchable=True, unit="%"),
    Column("test_input_size", "shape", "the size test_top1 and test_flops are at, e.g. [3, 288, 288]", size=64),
    Column(
        "test_flops",
        "int",
        "inference FLOPs at batch 1 at test_input_size (measured on meta, as flops is at input_size)",
        searchable=True,
        unit="FLOPs",
    ),
    Column(
        "pretrain",
        "text",
        "the data the weights were pretrained on before ImageNet-1k, as timm publishes it "
        "(in1k, in21k, in12k, laion2b, ...)",
        size=64,
        searchable=True,
    ),
    Column("real_top1", "float", "top-1 on ImageNet-ReaL labels", searchable=True, unit="%"),
    Column("real_top5", "float", "top-5 on ImageNet-ReaL labels", searchable=True, unit="%"),
    Column("v2_top1", "float", "top-1 on ImageNetV2 matched-frequency", searchable=True, unit="%"),
    Column("v2_top5", "float", "top-5 on ImageNetV2 matched-frequency", searchable=True, unit="%"),
    Column("sketch_top1", "float", "top-1 on ImageNet-Sketch", searchable=True, unit="%"),
    Column("sketch_top5", "float", "top-5 on ImageNet-Sketch", searchable=True, unit="%"),
    Column("a_top1", "float", "top-1 on ImageNet-A (natural adversarial)", searchable=True, unit="%"),
    Column("a_top5", "float", "top-5 on ImageNet-A", searchable=True, unit="%"),
    Column("r_top1", "float", "top-1 on ImageNet-R (renditions)", searchable=True, unit="%"),
    Column("r_top5", "float", "top-5 on ImageNet-R", searchable=True, unit="%"),
    Column("box_map", "float", "COCO val2017 box mAP", searchable=True, unit="%"),
    Column("mask_map", "float", "COCO val2017 mask mAP", searchable=True, unit="%"),
    Column("keypoint_map", "float", "COCO val2017 keypoint mAP", searchable=True, unit="%"),
    Column(
        "miou", "float", "segmentation mean IoU (COCO-val2017-VOC-labels for torchvision)", searchable=True, unit="%"
    ),
    Column("pixel_acc", "float", "segmentation pixel accuracy", searchable=True, unit="%"),
    Column("k400_top1", "float", "top-1 on Kinetics-400 (video clips)", searchable=True, unit="%"),
    Column("k400_top5", "float", "top-5 on Kinetics-400", searchable=True, unit="%"),
    # Language models: from the built module and its config.
    Column("inputs", "json", "the input spec analysis ran with: [{name, shape, dtype}, ...]", analysis=True),
    Column(
        "active_params",
        "int",
        "parameters used per token (MoE: shared + routed top-k; dense: params)",
        indexed=True,
        searchable=True,
        unit="elements",
    ),
    Column(
        "kv_bytes_per_token",
        "int",
        "KV-cache bytes per token at the config dtype, all layers",
        searchable=True,
        unit="bytes",
    ),
    Column(
        "flops_per_token",
        "int",
        "prefill FLOPs per token at the input spec's length",
        searchable=True,
        unit="FLOPs",
        analysis=True,
    ),
    Column("context_length", "int", "maximum positions the config allows", searchable=True, unit="tokens"),
    Column(
        "sliding_window", "int", "attention window of sliding-window layers, where any", searchable=True, unit="tokens"
    ),
    Column("layers", "int", "transformer layers (decoder layers for encoder-decoder)", searchable=True, unit="layers"),
    Column("hidden_size", "int", "model width", searchable=True, unit="elements"),
    Column("heads", "int", "attention (query) heads", searchable=True, unit="heads"),
    Column(
        "kv_heads", "int", "key/value heads (grouped-query attention: fewer than heads)", searchable=True, unit="heads"
    ),
    Column("vocab_size", "int", "tokenizer vocabulary", searchable=True, unit="tokens"),
    Column("experts", "int", "routed experts per MoE layer (0: dense)", searchable=True, unit="experts"),
    Column("experts_per_token", "int", "routed experts each token uses", searchable=True, unit="experts"),
    # The hub's own metadata for hf rows.
    Column("downloads", "int", "hub downloads (last 30 days) when indexed", searchable=True, unit="downloads"),
    Column("likes", "int", "hub likes when indexed", searchable=True, unit="likes"),
    Column("gated", "text", "hub gating: false, auto or manual", size=16, searchable=True),
    Column("last_modified", "datetime", "hub repo's last modification"),
    Column(
        "hub_params", "int", "the hub's parameter count from the safetensors metadata", searchable=True, unit="elements"
    ),
    # timm's published throughput (catalog/timm-results/benchmark-*.csv), at the row's own input size only
    *(
        col
        for name, doc in THROUGHPUT.items()
        for col in (
            Column(
                name,
                "float",
                f"{doc}, at the row's input_size, as timm published it; empty where it was not measured at that size",
                searchable=True,
                unit="samples/s",
            ),
            Column(
                f"{name}_batch",
                "int",
                f"the batch size {name} was measured at",
                wide=False,
                searchable=True,
                unit="samples",
            ),
        )
    ),
)

BY_NAME = {c.name: c for c in COLUMNS}

# A model name: parts of ASCII letters, digits and . _ - + joined by "/", none only dots ("..", "."), at most 255
# characters (what every family's names use; nothing a terminal or a file system reads as anything but text).
# Checked on write.
_NAME_PART = r"(?!\.+(?:/|$))[A-Za-z0-9._+-]+"
NAME_CHARACTERS = re.compile(rf"{_NAME_PART}(/{_NAME_PART})*")


def name_part(text: str) -> str:
    """`text` with each character outside a name's set as _ (a file's stem as a checkpoint's name)."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def check_name(name, new: bool = False) -> str:
    """A model name as given to a read (a string) or to a write (new=True: also the character set above)."""
    from zoo.errors import InvalidArgument

    if not isinstance(name, str):
        raise InvalidArgument(
            f"a model name is a string such as 'timm/resnet50', not {type(name).__name__} {name!r:.80}"
        )
    if new and not (len(name) <= 255 and NAME_CHARACTERS.fullmatch(name)):
        raise InvalidArgument(
            f"a model name is 1 to 255 ASCII letters, digits and . _ - +, in parts joined by '/' "
            f"and not only dots (such as user/my_net-v2), not {name!r:.300}"
        )
    return name


# Searchable field -> "number" or "string"; each is the registry column of the same name.
SEARCH_FIELDS: dict[str, str] = {c.name: c.search_type for c in COLUMNS if c.searchable}
PUBLIC = tuple(c for c in COLUMNS if c.public)
ANALYSIS = tuple(c for c in COLUMNS if c.analysis)
