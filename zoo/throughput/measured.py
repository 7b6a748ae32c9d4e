"""Search fields over the throughput that `zoo bench` measured (the measurements table), beside the columns.

A measured field compares a model's recorded measurements, not a column: its best one. `bench_cpu>100` matches
a model that some recorded inference run on a CPU did at more than 100 samples/s (any CPU model, dtype, batch
or settings; `zoo show NAME` lists each with its hardware, mode, who and when), and `bench_cpu<100` one whose
every run was slower: the number the search shows in its column and sorts by. A model without such a
measurement does not match, and `not bench_cpu>100` matches it, as a missing column value does.

Pure data: importing it imports neither torch nor SQLAlchemy.
"""

# field -> (device kind, mode) of the measurements it compares
MEASURED: dict[str, tuple[str, str]] = {
    "bench_cpu": ("cpu", "infer"),
    "bench_cuda": ("cuda", "infer"),
    "bench_train_cpu": ("cpu", "train"),
    "bench_train_cuda": ("cuda", "train"),
}
UNIT = "samples/s"


def doc(field: str) -> str:
    """What `zoo search --fields` says a measured field means."""
    device, mode = MEASURED[field]
    what = "inference" if mode == "infer" else "training steps (forward, loss, backward, optimizer step)"
    where = "a CPU" if device == "cpu" else "a CUDA GPU"
    return (
        f"measured by `zoo bench{' --train' if mode == 'train' else ''}`: {what} on {where}, the best recorded "
        f"run (any hardware model, dtype, batch); `zoo show` lists them"
    )


# A run's numbers (zoo.registry.tables.Measurement), and its JSON fields with what each holds
RUN_NUMBERS = ("batch", "threads", "samples_per_s", "step_ms", "peak_bytes", "steps", "warmup")
RUN_JSON = {"inputs": list, "versions": dict}


def clean_run(run: dict) -> dict:
    """A stored run as readers show it: its JSON fields decoded, and a value put in by hand that is not what zoo
    records (a number's text or infinity in SQLite, PostgreSQL's NaN; JSON of another shape) as None or empty, so
    that one bad row breaks no format and no JSON output."""
    from zoo.columns import finite, loads

    out = {**run, **{k: finite(run[k]) for k in RUN_NUMBERS if k in run}}
    for key, kind in RUN_JSON.items():
        try:
            value = loads(run[key])
        except (KeyError, TypeError, ValueError):
            value = None
        out[key] = value if isinstance(value, kind) else kind()
    return out
