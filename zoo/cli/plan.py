"""`zoo plan`: what a run needs on each device, whether it fits the hardware, the largest batch that does and a
predicted step time (zoo.plan), as a table or JSON."""

import argparse
import json

from zoo.render import human, table

EXAMPLES = """examples:
  zoo plan timm/resnet50 --hardware "RTX 4090" --training
  zoo plan hf/meta-llama/Llama-3.1-8B --hardware H100 --training --fsdp 8 --devices 8 --seq-len 4096
  zoo plan hf/meta-llama/Llama-3.1-70B --hardware A100-80GB --tp 4 --devices 4 --json
  zoo plan timm/vit_base_patch16_224 --hardware 24GiB --batch 64
  zoo plan timm/resnet50 --hardware L4 --training --input-size 3,160,160"""


def input_size(text: str) -> tuple[int, int, int]:
    """--input-size: C,H,W as `zoo index builder --input` spells a shape (commas), without the batch."""
    parts = text.replace(" ", "").split(",")
    if len(parts) != 3 or not all(p.isdigit() and 1 <= int(p) < 2**31 for p in parts):
        raise argparse.ArgumentTypeError(f"an input size is channels,height,width (3,224,224), not {text!r}")
    c, h, w = (int(p) for p in parts)
    return c, h, w


def add_parser(sub, common, name_help: str, whole) -> None:
    s = sub.add_parser(
        "plan",
        parents=[common],
        help="memory per device under DDP, FSDP and TP, whether it fits, the largest batch that does",
        description="Plan a run before renting the hardware: weights, gradients, optimizer states, activations, KV "
        "cache and the framework's own bytes on each device; the largest per-device batch that fits; a "
        "predicted step time. Model states are exact per shard (FSDP2 pads dim 0 as fully_shard does); "
        "activations are measured on meta and fitted in batch and sequence length.",
        epilog=EXAMPLES,
    )
    s.add_argument("name", help=name_help)
    s.add_argument(
        "--hardware",
        required=True,
        help="a device of catalog/hardware.csv by name or short name (H100, H200, A100-40GB, A100-80GB, L4, "
        "'RTX 3090', 'RTX 4090', 'RTX 5090'), cpu (this machine's RAM), or memory: 24GiB, 80GB",
    )
    s.add_argument("--devices", type=whole(1, "a device count"), default=1, help="devices in all: DDP x FSDP x TP")
    s.add_argument("--fsdp", type=whole(1, "an FSDP degree"), default=1, help="FSDP2 full sharding over N devices")
    s.add_argument("--tp", type=whole(1, "a TP degree"), default=1, help="tensor parallel degree (divides the heads)")
    s.add_argument("--training", action="store_true", help="a training step (default: inference)")
    s.add_argument("--batch", type=whole(1, "a batch"), default=None, help="samples per device (default: max_batch)")
    s.add_argument("--seq-len", type=whole(1, "a sequence length"), default=None, help="tokens (default: the row's)")
    s.add_argument(
        "--input-size",
        type=input_size,
        default=None,
        metavar="C,H,W",
        help="a vision model's input without the batch, e.g. 3,288,288 (default: the row's)",
    )
    s.add_argument(
        "--dtype",
        default=None,
        help="fp32, bf16, fp16, amp-bf16, amp-fp16 (autocast over fp32 master weights); default: amp-bf16 with "
        "--training, bf16 without",
    )
    s.add_argument(
        "--optimizer", default=None, choices=["adamw", "adam", "sgd", "none"], help="with --training (default adamw)"
    )
    s.add_argument("--checkpointing", action="store_true", help="with --training: activation checkpointing")
    s.add_argument("--kv-dtype", default=None, help="inference: the KV cache's dtype (fp8, int8, bf16, ...)")
    s.add_argument("--json", action="store_true", help="print the Plan's attributes as JSON")
    s.set_defaults(run=cmd_plan)


def cmd_plan(zoo, args) -> int:
    p = zoo.plan(
        args.name,
        hardware=args.hardware,
        devices=args.devices,
        fsdp=args.fsdp,
        tp=args.tp,
        training=args.training,
        batch=args.batch,
        seq_len=args.seq_len,
        input_size=args.input_size,
        dtype=args.dtype,
        optimizer=args.optimizer,
        checkpointing=args.checkpointing,
        kv_dtype=args.kv_dtype,
    )
    if args.json:
        print(json.dumps(p.as_dict(), indent=1))
        return 0
    mode = f"training ({p.optimizer}, {p.dtype})" if p.training else f"inference ({p.dtype})"
    seq = f", seq_len {p.seq_len}" if p.seq_len else ""
    print(
        f"{p.name} on {p.devices} x {p.hardware}: DDP {p.ddp} x FSDP {p.fsdp} x TP {p.tp}, {mode}, batch {p.batch}{seq}"
    )
    rows = [[k, human(v, "B")] for k, v in p.per_device.items() if k != "total"]
    rows += [["total", human(p.per_device["total"], "B")], ["capacity", human(p.capacity, "B")]]
    print(table([["per device", "bytes"], *rows]))
    print(f"fits: {'yes' if p.fits else 'NO'}    max_batch: {p.max_batch}")
    if p.max_context is not None:
        print(f"max_context: {p.max_context} tokens at batch {p.batch}    max_tokens (KV cache): {p.max_tokens}")
    if p.step_seconds is not None:
        band = p.step_band or {}
        spread = f", 90% of held-out models {band['low'] * 1e3:.1f}-{band['high'] * 1e3:.1f} ms" if band else ""
        fraction = f" (roofline / {band['ratio']}, {band.get('family') or 'median model'})" if band else ""
        print(f"step: {p.step_seconds * 1e3:.1f} ms predicted{spread}{fraction}")
    for note in p.notes:
        print(f"  {note}")
    return 0
