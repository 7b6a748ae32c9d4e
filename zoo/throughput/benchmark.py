"""Throughput of a model on this machine, measured as timm's benchmark.py measures it, and recorded in the registry.

The model is materialized by zoo without weights (the constructor's init: speed does not depend on the values)
and fed random inputs at the row's own recorded input spec. Like benchmark.py: `warmup` untimed steps, then
`steps` timed ones, each timed with a device synchronize at its end; samples/s is the samples over the timed
loop's wall time, step time the mean of the steps. Inference runs under inference_mode in eval mode; a training
step is forward, loss (cross-entropy on random classes for a [batch, classes] output, as benchmark.py's; the mean
of the outputs for any other), backward and an SGD step (lr 1e-4, momentum 0.9, nesterov: timm's 'sgd').
--dtype casts the model and its float inputs (benchmark.py's --precision, not autocast).
Peak memory covers the model, its inputs and the run: torch.cuda.max_memory_allocated on CUDA; on a CPU the peak
RSS growth over the process's RSS before the model was allocated (Linux: VmHWM, reset through clear_refs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace

from zoo.dtypes import float_dtype, short_name
from zoo.errors import BenchFailed, InvalidArgument, ZooError, reason

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class BenchOptions:
    """What a run measures (zoo.bench's keyword arguments): refused as a whole before anything is built."""

    device: str = "cpu"
    batch: int = 1
    dtype: str = "fp32"
    train: bool = False  # a training step (SGD with momentum, as timm's benchmark) instead of inference
    steps: int = 40
    warmup: int = 10
    compile: bool = False  # torch.compile first
    channels_last: bool = False

    @classmethod
    def of(cls, options: dict) -> BenchOptions:
        """The options from keyword arguments, checked (InvalidArgument naming the argument); a CUDA run needs a
        usable GPU."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(options) - set(known)):
            raise InvalidArgument(f"unknown bench option {', '.join(unknown)}: the options are {', '.join(known)}")
        o = cls(**options)
        if o.device not in DEVICES:
            raise InvalidArgument(f"device is one of {', '.join(DEVICES)}, not {o.device!r}", "device")
        short_name(o.dtype)  # InvalidArgument unless a floating dtype (zoo.dtypes)
        for what, value, least in (("batch", o.batch, 1), ("steps", o.steps, 1), ("warmup", o.warmup, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= 1_000_000:
                raise InvalidArgument(f"{what} is a whole number from {least} to 1000000, not {value!r}", what)
        if o.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise InvalidArgument(
                    "device 'cuda': torch sees no usable CUDA GPU here (torch.cuda.is_available() is False): "
                    "bench on device 'cpu', or on a machine with a GPU",
                    "device",
                )
        return replace(o, dtype=short_name(o.dtype))  # "half", "float16" and "fp16" are one kind of run


def hardware(device: str) -> str:
    """This machine's name for the device: the GPU's model, or the CPU's ("model name" in /proc/cpuinfo)."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())[:255]
    except OSError:
        pass
    import platform  # here, as the other standard modules a run alone needs: `zoo show` imports this module

    return (platform.processor() or platform.machine() or "unknown CPU")[:255]


def versions() -> dict:
    """The versions of the libraries a measurement depends on (those installed); torch's with its build (+cu130)."""
    from importlib import metadata

    import torch

    out = {"torch": torch.__version__}
    for lib in ("timm", "torchvision", "transformers", "zoo"):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    return out


def who() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:255]


def _rss(field: str, path: str = "/proc/self/status") -> int | None:
    """A "Field: N kB" line of a /proc file in bytes (Linux); None elsewhere."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def check_memory(spec: dict, batch: int, device: str, dtype: str) -> None:
    """Refuse (InvalidArgument) a batch whose inputs alone need more memory than is free here: torch would
    try to allocate it (a CPU's 300 GB fails at once, or pages the machine out) before the first step."""
    import torch

    from zoo.analysis.inputs import make_inputs, tensor_leaves

    need = sum(t.numel() * t.element_size() for t in tensor_leaves(make_inputs(spec, batch, dtype=float_dtype(dtype))))
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else _rss("MemAvailable", "/proc/meminfo")
    if free is not None and need > free:
        raise InvalidArgument(
            f"batch {batch}: the inputs alone take {need / 2**30:.1f} GiB, more than the "
            f"{free / 2**30:.1f} GiB free on this {device}: give a smaller batch",
            "batch",
        )


def _real_inputs(spec: dict, batch: int, device: str, dtype, channels_last: bool):
    """The spec's (args, kwargs) as tensors on `device`: random floats (in `dtype`), zeros for integers."""
    import torch

    from zoo.analysis.inputs import make_inputs

    def real(t):
        if isinstance(t, list):
            return [real(x) for x in t]
        if not t.dtype.is_floating_point:
            return torch.zeros(t.shape, dtype=t.dtype, device=device)
        x = torch.randn(t.shape, dtype=t.dtype, device=device)
        return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x

    args, kwargs = make_inputs(spec, batch=batch, dtype=dtype)
    return [real(a) for a in args], {k: real(v) for k, v in kwargs.items()}


def _loss(output):
    import torch

    if isinstance(output, (tuple, list)):
        output = output[0]
    if isinstance(output, torch.Tensor) and output.dim() == 2 and output.is_floating_point():
        target = torch.randint(0, output.shape[1], (output.shape[0],), device=output.device)
        return torch.nn.functional.cross_entropy(output.float(), target)
    from zoo.analysis.inputs import tensor_leaves

    leaves = [t for t in tensor_leaves(output) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise InvalidArgument("train: the model's output holds no tensor to take a loss of", "train")
    return sum(t.float().mean() for t in leaves)


def measure(module, spec: dict, o: BenchOptions) -> dict:
    """Time a module that is still on meta: materialize it (init) on the device, then warm up and time it."""
    import torch

    cuda = o.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = _rss("VmRSS") if not cuda and _reset_peak_rss() else None
    tdtype = float_dtype(o.dtype)
    module.materialize(device=o.device)
    module.to(dtype=tdtype, memory_format=torch.channels_last if o.channels_last else torch.preserve_format)
    module.train(o.train)
    args, kwargs = _real_inputs(spec, o.batch, o.device, tdtype, o.channels_last)
    model = torch.compile(module) if o.compile else module
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if o.train:
        optimizer = torch.optim.SGD(module.parameters(), lr=1e-4, momentum=0.9, nesterov=True)

        def step():
            optimizer.zero_grad()
            _loss(model(*args, **kwargs)).backward()
            optimizer.step()
    else:

        def step():
            model(*args, **kwargs)

    with torch.inference_mode(not o.train):
        for _ in range(o.warmup):
            step()
        sync()
        total = 0.0
        start = time.perf_counter()
        for _ in range(o.steps):
            t = time.perf_counter()
            step()
            sync()
            total += time.perf_counter() - t
        elapsed = time.perf_counter() - start
    if cuda:
        peak = torch.cuda.max_memory_allocated()
    else:
        hwm = None if base is None else _rss("VmHWM")
        peak = None if base is None or hwm is None else max(0, hwm - base)
    return {"samples_per_s": o.batch * o.steps / elapsed, "step_ms": 1000 * total / o.steps, "peak_bytes": peak}


def run(zoo, name: str, record: bool = True, skip_recorded: bool = False, **options) -> dict:
    """Measure `name` from the registry `zoo` (a Zoo) and record the run there; returns the run's fields (as
    recorded) with "name" and "skipped" (True: skip_recorded found a run of the same kind, nothing was measured)."""
    import torch

    o = BenchOptions.of(options)
    target = zoo._writable if record else zoo.url  # refused before a minute of measuring, not after
    from zoo.analysis.inputs import spec_of_inputs
    from zoo.registry import db, measurements

    info = zoo.info(name)
    if not info.inputs:
        raise InvalidArgument(
            f"{info.name} has no recorded input spec (scan status {info.scan_status}): nothing to "
            f"feed it; index it with an input (zoo index builder ... --input) first"
        )
    spec = spec_of_inputs(info.inputs)
    kind = {
        "hardware": hardware(o.device),
        "device": o.device,
        "mode": "train" if o.train else "infer",
        "dtype": o.dtype,
        "batch": o.batch,
        "compiled": bool(o.compile),
        "channels_last": bool(o.channels_last),
        "threads": torch.get_num_threads(),
    }
    if skip_recorded:
        with db.session(zoo.url) as s:
            if measurements.recorded(s, info.name, kind):
                return {"name": info.name, "skipped": True, **kind}
    check_memory(spec, o.batch, o.device, o.dtype)
    module = zoo.get(info.name)
    try:
        result = measure(module, spec, o)
    except ZooError:
        raise
    except Exception as e:  # the model's own code raised (any exception), or torch ran out of memory
        text = " ".join(str(e).split())
        if isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in text:
            raise BenchFailed(
                f"{info.name} ran out of memory on {o.device} at batch {o.batch}: give a smaller batch ({text[:300]})"
            ) from e
        raise BenchFailed(f"{info.name} failed on {o.device} at batch {o.batch}: {reason(e)}") from e
    shapes = [{**i, "shape": [o.batch, *i["shape"][1:]]} for i in info.inputs]
    values = {
        **kind,
        **result,
        "inputs": shapes,
        "steps": o.steps,
        "warmup": o.warmup,
        "versions": versions(),
        "who": who(),
    }
    if record:
        with db.session(target, write=True) as s, s.begin():
            measurements.record(s, info.name, values)
    return {"name": info.name, "skipped": False, **values}


def run_search(zoo, expression, report=None, **options) -> list[dict]:
    """Bench every match of a search, one after another, each recorded as soon as it is measured; a model with a
    recorded run of the same kind (same hardware and mode) is skipped, so a run that stopped resumes where it
    stopped. A model that fails, whatever it raises, is reported ({"name", "error"}) and the run goes on; only an
    interrupt (KeyboardInterrupt) stops it.
    report(name, done, total, result) is called after each model."""
    BenchOptions.of({k: v for k, v in options.items() if k != "record"})
    if options.get("record", True):
        _ = zoo._writable  # a read-only registry is refused once, not reported as every model's failure
    names = [r["name"] for r in zoo.search(expression, fields=("name",))]
    out = []
    for i, name in enumerate(names):
        try:
            result = run(zoo, name, skip_recorded=True, **options)
        except Exception as e:  # its build, its forward (an AssertionError, a KeyError: any), its memory
            result = {"name": name, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        out.append(result)
        if report is not None:
            report(name, i + 1, len(names), result)
    return out


def recorded_runs(zoo, name: str) -> list[dict]:
    """Every recorded run of a model, oldest first (SQLite: read without SQLAlchemy, as `zoo show` is)."""
    from zoo.registry import lite

    full = zoo.info(name).name
    runs = lite.measurements(zoo.url, full)
    if runs is None:
        from zoo.registry import db, measurements

        with db.session(zoo.url) as s:
            runs = measurements.of_model(s, full)
    return runs


def fastest(zoo, names: list[str], field: str) -> dict[str, float]:
    """Name -> the best samples/s among its runs that a measured field (bench_cpu, ...) compares."""
    from zoo.registry import lite
    from zoo.throughput.measured import MEASURED

    found = lite.fastest(zoo.url, names, *MEASURED[field])
    if found is None:
        from zoo.registry import db, measurements

        with db.session(zoo.url) as s:
            found = measurements.fastest(s, names, *MEASURED[field])
    return found
