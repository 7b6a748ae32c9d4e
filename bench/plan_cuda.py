"""zoo.plan against a real training step on a CUDA GPU: for ten timm models, the step at the plan's max_batch (it
should fit) and at max_batch + 1 (it should run out of memory), with torch.cuda.max_memory_allocated beside the
plan's total at each.

The step is the one bench/plan_vs_published.py plans (timm's benchmark.py training configuration): the model zoo
materializes on the GPU in float32, train mode; a float32 torch.randn input at the row's input size; forward and
nn.CrossEntropyLoss against random targets under torch.autocast(fp16) (amp-fp16), backward inside it; timm's 'sgd'
(torch.optim.SGD, momentum 0.9, Nesterov); zero_grad(set_to_none=False), so the gradients live between steps as the
plan counts them. Each batch runs --steps steps (default 2: the first makes the momentum buffers, the second is the
steady state the plan describes); the peak is over both, after torch.cuda.reset_peak_memory_stats.

The hardware (--hardware):
  - free (default): the GPU's own free memory in bytes (torch.cuda.mem_get_info, after the CUDA context exists),
    given to zoo.plan as bytes. A plan of bytes counts no GPU overheads (zoo.planning.OTHER's cuda_reserve and
    allocator apply to the devices of the hardware table only), so the caching allocator's rounding shows up
    as reserved minus allocated; the GPU itself is the limit.
  - a device of catalog/hardware.csv ("RTX 3090", "L4", ...) no larger than this GPU: planned as that device (its
    overheads included), emulated by capping the caching allocator at its capacity
    (torch.cuda.set_per_process_memory_fraction(capacity / total)); the CUDA context lies outside the cap.

Printed per model: the planned max_batch, the plan's total and the measured max_memory_allocated and
max_memory_reserved at max_batch and at max_batch + 1, whether each step ran or ran out of memory, and the error
(measured - planned) / planned of the allocated bytes. Targets (printed, not asserted): every model fits at
max_batch; out of memory at max_batch + 1 needs the plan right to one sample's bytes (a fraction of a percent at
these batches), so it counts how often that holds rather than expecting it.

    python bench/plan_cuda.py [--hardware free|NAME] [--models resnet18 ...] [--steps 2] [--json]

Needs a CUDA GPU; without one it says so and exits with status 2.
"""

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# small to medium: CNNs of four families, a mobile net, a dense net, two ViTs and a Swin
MODELS = [
    "resnet18",
    "resnet50",
    "efficientnet_b0",
    "mobilenetv3_large_100",
    "densenet121",
    "regnety_016",
    "convnext_tiny",
    "vit_small_patch16_224",
    "swin_tiny_patch4_window7_224",
    "vit_base_patch16_224",
]
RUN = dict(training=True, dtype="amp-fp16", optimizer="sgd")  # as bench/plan_vs_published.py plans timm's step


def planned(z, name: str, hardware, batch: int | None = None):
    """zoo.plan of timm/NAME's training step on `hardware` (bytes or a device name), at `batch` or at max_batch."""
    return z.plan(f"timm/{name}", hardware=hardware, batch=batch, **RUN)


def build(z, name: str, device: str):
    """The model zoo materializes on `device` (float32, its constructor's initialization), in train mode, and its
    optimizer: timm's 'sgd'."""
    import torch

    model = z.get(f"timm/{name}").materialize(device=device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True)
    return model, opt


def train_steps(model, opt, batch: int, input_size, device: str, steps: int = 2) -> None:
    """`steps` training steps at `batch`: fp32 input, autocast fp16 forward, cross-entropy, backward inside the
    autocast region, SGD step, gradients zeroed in place."""
    import torch

    classes = getattr(model, "num_classes", 1000)
    for _ in range(steps):
        x = torch.randn((batch, *input_size), device=device)
        target = torch.randint(0, classes, (batch,), device=device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), target)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        del x, target, loss


def measure(model, opt, batch: int, input_size, steps: int) -> dict:
    """The steps at `batch` on the current CUDA device: whether they ran, the peak allocated and reserved bytes."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        train_steps(model, opt, batch, input_size, "cuda", steps)
        torch.cuda.synchronize()
        ran = True
    except torch.OutOfMemoryError:
        ran = False
    out = dict(
        ran=ran,
        allocated=torch.cuda.max_memory_allocated(),
        reserved=torch.cuda.max_memory_reserved(),
        seconds=time.perf_counter() - start,
    )
    opt.zero_grad(set_to_none=False)
    gc.collect()
    torch.cuda.empty_cache()
    return out


def check(z, name: str, hardware, steps: int) -> dict:
    """One model: the plan at max_batch and max_batch + 1, and the measured steps at both."""
    import torch

    best = planned(z, name, hardware)
    over = planned(z, name, hardware, best.max_batch + 1)
    size = tuple(z.info(f"timm/{name}").input_size)
    model, opt = build(z, name, "cuda")
    try:
        at = measure(model, opt, best.max_batch, size, steps) if best.max_batch else None
        above = measure(model, opt, best.max_batch + 1, size, steps)
    finally:
        del model, opt
        gc.collect()
        torch.cuda.empty_cache()
    return dict(
        model=name,
        input_size=list(size),
        capacity=best.capacity,
        max_batch=best.max_batch,
        planned=best.per_device["total"],
        planned_above=over.per_device["total"],
        at=at,
        above=above,
        error=(at["allocated"] - best.per_device["total"]) / best.per_device["total"] if at else None,
    )


def gib(n) -> str:
    return f"{n / 2**30:.2f}"


def show(rows: list[dict], hardware: str) -> None:
    print(f"hardware: {hardware}; a training step, amp-fp16, sgd; GiB")
    head = (
        "model",
        "max_batch",
        "plan",
        "allocated",
        "reserved",
        "at max",
        "plan +1",
        "allocated +1",
        "at +1",
        "error",
    )
    print(" | ".join(head))
    for r in rows:
        at, above = r["at"] or {}, r["above"]
        print(
            " | ".join(
                [
                    r["model"],
                    str(r["max_batch"]),
                    gib(r["planned"]),
                    gib(at.get("allocated", 0)),
                    gib(at.get("reserved", 0)),
                    "fits" if at.get("ran") else "OOM",
                    gib(r["planned_above"]),
                    gib(above["allocated"]),
                    "fits" if above["ran"] else "OOM",
                    f"{r['error']:+.2%}" if r["error"] is not None else "-",
                ]
            )
        )
    fits = sum(bool(r["at"] and r["at"]["ran"]) for r in rows)
    oom = sum(not r["above"]["ran"] for r in rows)
    errors = [abs(r["error"]) for r in rows if r["error"] is not None and r["at"]["ran"]]
    print(f"fits at max_batch: {fits}/{len(rows)} (target {len(rows)}/{len(rows)})")
    print(f"out of memory at max_batch + 1: {oom}/{len(rows)} (needs the plan right to one sample's bytes)")
    if errors:
        print(f"|allocated - plan| / plan where it ran: median {statistics.median(errors):.2%}, max {max(errors):.2%}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hardware", default="free", help="free (this GPU's free memory), or a hardware-table device")
    p.add_argument("--models", nargs="+", default=MODELS, help="timm model names of the registry")
    p.add_argument("--steps", type=int, default=2, help="training steps at each batch")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench/plan_cuda.py needs a CUDA GPU: torch.cuda.is_available() is False here", file=sys.stderr)
        return 2

    import zoo
    from zoo.planning import hardware_of

    torch.empty(1, device="cuda")  # the CUDA context first: free memory is what is left beside it
    free, total = torch.cuda.mem_get_info()
    if args.hardware == "free":
        hardware, label = free, f"{torch.cuda.get_device_name()}, its free memory ({gib(free)} of {gib(total)})"
    else:
        device = hardware_of(args.hardware)
        if device.capacity > total:
            print(f"{device.name} ({gib(device.capacity)} GiB) is larger than this GPU ({gib(total)})", file=sys.stderr)
            return 1
        torch.cuda.set_per_process_memory_fraction(device.capacity / total)
        hardware, label = args.hardware, f"{device.name} emulated on {torch.cuda.get_device_name()}"
    z = zoo.Zoo()
    rows = []
    for name in args.models:
        rows.append(check(z, name, hardware, args.steps))
        r = rows[-1]
        print(f"{name}: max_batch {r['max_batch']}, fits {r['at'] and r['at']['ran']}, +1 {r['above']['ran']}")
    if args.json:
        print(json.dumps({"hardware": label, "rows": rows}, indent=1))
    else:
        show(rows, label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
