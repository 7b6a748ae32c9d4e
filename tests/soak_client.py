"""A long-lived registry client for the soak test (tests/test_registry_integrity.py), as its own process.

`python -m tests.soak_client client URL ME UNTIL WEIGHTS`: one `Zoo` kept for the whole run, mixing in-process
writes (index a builder, remove, add weights, bench) with reads (info, search, a misspelt name's did-you-mean)
until the epoch second UNTIL; then `zoo.cache_clear()`, which closes its connections (a stale WAL would be
written back over the file there). Prints JSON: the acknowledged writes in order, every error, the op count.

`python -m tests.soak_client state URL`: what a fresh process sees of the user models: JSON
{name: {"tags": [...], "runs": N}}.
"""

import json
import random
import sys
import time

BUILDER, INPUTS = "tests.builders:conv_net", [{"shape": [1, 3, 32, 32]}]


def client(url: str, me: str, until: float, weights: str) -> dict:
    import zoo

    registry, rng = zoo.connect(url), random.Random(me)
    acked, errors, mine, ops = [], [], [], 0
    while time.time() < until:
        ops += 1
        op = rng.choice(["index", "index", "remove", "weights", "read", "read", "typo", "bench"])
        if not mine:
            op = "index"
        try:
            if op == "index":
                name = f"user/{me}-{ops}"
                registry.index_builder(BUILDER, name, inputs=INPUTS)
                mine.append(name)
                acked.append(["present", name])
            elif op == "remove":
                name = mine.pop(rng.randrange(len(mine)))
                registry.remove(name)
                acked.append(["absent", name])
            elif op == "weights":
                registry.add_weights(mine[-1], weights, tag=f"t{ops}")
                acked.append(["weights", mine[-1], f"t{ops}"])
            elif op == "bench":
                zoo.bench(mine[-1], registry=registry, steps=1, warmup=0)
                acked.append(["measured", mine[-1]])
            elif op == "typo":
                try:
                    registry.info(f"user/{me}-typo{ops}")
                    errors.append("typo: a misspelt name was found")
                except zoo.ModelNotFound:
                    pass
            else:  # this process reads its own writes, through both readers
                for name in mine[-3:]:
                    if registry.info(name).name != name:
                        errors.append(f"read: info({name}) gave another model")
                seen = {r["name"] for r in registry.search("family=user", fields=("name",))}
                if set(mine) - seen:
                    errors.append(f"read: its own models missing from a search: {sorted(set(mine) - seen)}")
        except Exception as e:  # every failure is the test's finding, whatever its type
            errors.append(f"{op}: {type(e).__name__}: {e}")
    try:
        zoo.cache_clear()
    except Exception as e:
        errors.append(f"cache_clear: {type(e).__name__}: {e}")
    return {"acked": acked, "errors": errors, "ops": ops}


def state(url: str) -> dict:
    import zoo
    from zoo.throughput.benchmark import recorded_runs

    registry = zoo.connect(url)
    out = {}
    for row in registry.search("family=user", fields=("name",)):
        info = registry.info(row["name"])
        out[info.name] = {
            "tags": sorted(w["tag"] for w in info.weights),
            "runs": len(recorded_runs(registry, info.name)),
        }
    return out


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    if role == "client":
        print(json.dumps(client(url, sys.argv[3], float(sys.argv[4]), sys.argv[5])))
    else:
        print(json.dumps(state(url)))
