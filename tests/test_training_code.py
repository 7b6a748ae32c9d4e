"""A materialized model in ordinary training code, one test per thing a user does with it: train a
BatchNorm model, save it, hook it, load it lazily and then use it in any way, wrap it. Each compares
with the library's own model used the same way (tests/test_dropin.py runs the whole training parity
suite; tests/test_placement.py the tensor-parallel and FSDP2 x TP loads)."""

import io
import os

import pytest
import torch
from safetensors.torch import save_file

from tests.test_materialize import eager_model, example_input, save
from zoo.errors import InvalidArgument

R18 = "timm/resnet18"


def saved_size(obj) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return len(buffer.getvalue())


def loaded(zoo_at, tmp_path, name=R18):
    eager = eager_model(name)
    return zoo_at.get(name).materialize(weights=save(tmp_path, eager)), eager


def on_meta(module) -> list[str]:
    """Names of tensors still on meta, read without listing parameters() (on a lazy module that loads)."""
    return [
        f"{prefix}.{key}"
        for prefix, mod in module.named_modules()
        for key, t in [*mod._parameters.items(), *mod._buffers.items()]
        if t is not None and t.is_meta
    ]


def test_a_batchnorm_model_trains_after_materialize_as_the_eager_one(zoo_at, tmp_path):
    """Every tensor its own storage and version counter: BatchNorm's in-place running-stat updates
    no longer break backward (one shared arena raised 'modified by an inplace operation')."""
    m, eager = loaded(zoo_at, tmp_path)
    assert len({t.untyped_storage().data_ptr() for t in m.state_dict().values()}) == len(m.state_dict())
    x = example_input(R18)
    for model in (m, eager):
        model.train()
        model(x).square().mean().backward()
    for (name, p), q in zip(m.named_parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad), name
    assert torch.equal(m.bn1.running_mean, eager.bn1.running_mean)


def test_torch_save_writes_what_eager_writes_for_the_model_and_for_one_submodule(zoo_at, tmp_path):
    """torch.save of the state dict works (one storage of many dtypes refused it), and a submodule's
    state dict holds only its own bytes (the arena wrote the whole model for the head)."""
    m, eager = loaded(zoo_at, tmp_path)
    assert saved_size(m.state_dict()) == saved_size(eager.state_dict())
    assert saved_size(m.fc.state_dict()) == saved_size(eager.fc.state_dict()) < 3_000_000
    back = torch.load(io.BytesIO(_bytes(m.state_dict())), weights_only=True)
    assert all(torch.equal(back[k], v) for k, v in eager.state_dict().items())


def _bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_copy_false_views_are_separate_storages_too(zoo_at, tmp_path):
    eager = eager_model(R18)
    m = zoo_at.get(R18).materialize(weights=save(tmp_path, eager), copy=False)
    assert saved_size(m.fc.state_dict()) == saved_size(eager.fc.state_dict())
    m.train()
    m(example_input(R18)).sum().backward()


def test_tensor_hooks_registered_on_meta_fire_after_materialize(zoo_at, tmp_path):
    """register_hook and register_post_accumulate_grad_hook on the meta parameters fire as on the eager
    model's (0 fired before: autograd kept them on the meta tensors swapped out); handles still remove."""
    eager = eager_model(R18)
    counts, handles = {}, []
    m = zoo_at.get(R18)
    for tag, model in (("zoo", m), ("eager", eager)):
        counts[tag] = 0
        for p in model.parameters():
            handles.append(p.register_hook(lambda g, tag=tag: counts.__setitem__(tag, counts[tag] + 1)))
            p.register_post_accumulate_grad_hook(lambda t, tag=tag: counts.__setitem__(tag, counts[tag] + 1))
    m.materialize(weights=save(tmp_path, eager))
    x = example_input(R18)
    for model in (m, eager):
        model(x).sum().backward()
    assert counts["zoo"] == counts["eager"] == 2 * len(list(eager.parameters()))
    for handle in handles:
        handle.remove()
    m(x).sum().backward()
    assert counts["zoo"] == counts["eager"] + len(list(eager.parameters()))  # the post-accumulate ones only


def test_module_hooks_parameter_order_and_an_optimizer_built_on_meta_survive(zoo_at, tmp_path):
    eager = eager_model(R18)
    m = zoo_at.get(R18)
    calls = []
    m.layer1.register_forward_hook(lambda mod, args, out: calls.append(out.shape))
    names = [n for n, _ in m.named_parameters()]
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    m.materialize(weights=save(tmp_path, eager))
    assert names == [n for n, _ in eager.named_parameters()] == [n for n, _ in m.named_parameters()]
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    x = example_input(R18)
    for model, opt in ((m, optimizer), (eager, eager_optimizer)):
        model(x).sum().backward()
        opt.step()
    assert calls and all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), eager.state_dict().values()))


def test_strict_false_reports_missing_and_unexpected_keys_as_load_state_dict_does(zoo_at, tmp_path):
    eager = eager_model(R18)
    state = {k: v.clone() for k, v in eager.state_dict().items() if not k.startswith("fc.")}
    state["extra.weight"] = torch.zeros(3)
    m = zoo_at.get(R18)
    assert m.materialize(weights=state, strict=False) is m
    reference = eager_model(R18).load_state_dict(state, strict=False)
    assert m.materialize.incompatible_keys == reference
    assert m.materialize.incompatible_keys.missing_keys == ["fc.weight", "fc.bias"]
    m2 = zoo_at.get(R18).materialize(weights=save(tmp_path, eager))
    assert m2.materialize.incompatible_keys == eager.load_state_dict(eager.state_dict())  # nothing missing


def test_a_save_pretrained_style_directory_loads_without_a_trailing_slash(zoo_at, tmp_path, monkeypatch):
    eager = eager_model(R18)
    (tmp_path / "r18").mkdir()
    save_file(dict(eager.state_dict()), str(tmp_path / "r18" / "model.safetensors"))
    monkeypatch.chdir(tmp_path)
    m = zoo_at.get(R18, weights="r18")
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), eager.state_dict().values()))


# --- lazy ----------------------------------------------------------------------------------------


def lazy(zoo_at, tmp_path, name=R18):
    eager = eager_model(name)
    return zoo_at.get(name, weights=save(tmp_path, eager), dispatch="lazy"), eager


def test_lazy_then_the_users_own_weights_are_never_overwritten(zoo_at, tmp_path):
    """load_state_dict(assign=True), an explicit .materialize(weights=other) and to_empty each leave
    the user's values in place at the first forward (it used to reload zoo.get's weights over them)."""
    x = example_input(R18)
    other = eager_model(R18, seed=7)
    m, _ = lazy(zoo_at, tmp_path)
    m.load_state_dict(other.state_dict(), assign=True)
    m.eval(), other.eval()
    with torch.no_grad():
        assert torch.equal(m(x), other(x))
    m, _ = lazy(zoo_at, tmp_path)
    m.materialize(weights=save(tmp_path, other, "other.safetensors"))
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x), other(x))
    m, _ = lazy(zoo_at, tmp_path)
    m.to_empty(device="cpu")
    torch.nn.init.constant_(m.fc.weight, 0.5)
    m(x)
    assert bool((m.fc.weight == 0.5).all())


def test_lazy_fills_what_is_still_on_meta_around_a_new_head(zoo_at, tmp_path):
    m, eager = lazy(zoo_at, tmp_path)
    m.reset_classifier(10)  # a real, new head: the user's
    head = m.fc.weight.clone()
    m.eval(), eager.eval()
    x = example_input(R18)
    with torch.no_grad():
        assert torch.equal(m.forward_features(x), eager.forward_features(x))
    assert torch.equal(m.fc.weight, head) and not on_meta(m)


def test_lazy_loads_on_a_first_call_of_forward_features_or_of_a_submodule(zoo_at, tmp_path):
    x = example_input(R18)
    m, eager = lazy(zoo_at, tmp_path)
    m.eval(), eager.eval()
    with torch.no_grad():
        assert torch.equal(m.forward_features(x), eager.forward_features(x))
    m, eager = lazy(zoo_at, tmp_path)
    with torch.no_grad():
        assert torch.equal(m.conv1(x), eager.conv1(x))  # a conv alone used to compute on meta weights
    assert not on_meta(m) and not any(mod._forward_pre_hooks for mod in m.modules())


def test_lazy_module_compiled_before_its_first_call_loads_and_runs_as_eager(zoo_at, tmp_path):
    """torch.compile(m) and m.compile() of a still-lazy module: the first call loads it, outside Dynamo's
    trace (inside it, Dynamo's weak references to the meta parameters made every later call fail)."""
    x = example_input(R18)
    for compiled in ("torch.compile", "Module.compile"):
        m, eager = lazy(zoo_at, tmp_path)
        m.eval(), eager.eval()
        if compiled == "torch.compile":
            run = torch.compile(m, backend="eager")
        else:
            m.compile(backend="eager")
            run = m
        with torch.no_grad():
            assert torch.equal(run(x), eager(x)), compiled
            assert torch.equal(m(x), eager(x)), compiled
        assert not on_meta(m)
    torch._dynamo.reset()


def test_lazy_state_dict_and_torch_save_before_any_forward_hold_the_weights(zoo_at, tmp_path):
    m, eager = lazy(zoo_at, tmp_path)
    assert on_meta(m)
    head = m.fc.state_dict()  # a submodule's state dict loads the whole model once
    assert torch.equal(head["weight"], eager.fc.weight) and not on_meta(m)
    m, eager = lazy(zoo_at, tmp_path)
    back = torch.load(io.BytesIO(_bytes(m.state_dict())), weights_only=True)
    assert all(torch.equal(back[k], v) for k, v in eager.state_dict().items())
    assert "state_dict" not in vars(m) and "named_parameters" not in vars(m)  # nothing left in front of the class


def test_lazy_load_state_dict_without_assign_ends_with_the_users_values(zoo_at, tmp_path):
    other = eager_model(R18, seed=3)
    m, _ = lazy(zoo_at, tmp_path)
    assert m.load_state_dict(other.state_dict()) == other.load_state_dict(other.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), other.state_dict().values()))


def test_lazy_module_moved_or_listed_loads_first(zoo_at, tmp_path):
    m, eager = lazy(zoo_at, tmp_path)
    m.to(torch.float64)  # torch's "Cannot copy out of meta tensor" before
    assert m.fc.weight.dtype == torch.float64 and torch.equal(m.fc.weight, eager.fc.weight.double())
    m, eager = lazy(zoo_at, tmp_path)
    optimizer = torch.optim.AdamW(m.parameters())  # listing the model's parameters is a use
    assert not on_meta(m) and optimizer.param_groups[0]["params"][0] is m.conv1.weight
    m, eager = lazy(zoo_at, tmp_path)
    stats = dict(m.named_buffers())  # and so is listing its buffers (BatchNorm's running statistics)
    assert not on_meta(m) and torch.equal(stats["bn1.running_var"], eager.bn1.running_var)
    assert "named_buffers" not in vars(m)


def test_lazy_module_pickles_and_deep_copies_pending(zoo_at, tmp_path):
    import copy
    import pickle

    x = example_input(R18)
    for clone in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        m, eager = lazy(zoo_at, tmp_path)
        twin = clone(m)
        twin.eval(), eager.eval()
        with torch.no_grad():
            assert torch.equal(twin(x), eager(x))
        assert on_meta(m)  # the original is still pending


def test_ddp_wraps_a_lazy_module_by_loading_it_first(zoo_at, tmp_path):
    """DistributedDataParallel lists the module's parameters: a lazy module loads then (torch's
    'Tensor.item() cannot be called on meta tensors' before). One gloo rank in this process."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'ddp'}", rank=0, world_size=1)
    try:
        m, eager = lazy(zoo_at, tmp_path)
        ddp, eager_ddp = DistributedDataParallel(m), DistributedDataParallel(eager)
        x = example_input(R18)
        for model in (ddp, eager_ddp):
            model(x).sum().backward()
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(m.parameters(), eager.parameters()))
    finally:
        dist.destroy_process_group()


def test_dtype_is_checked_before_a_lazy_load(zoo_at, tmp_path):
    with pytest.raises(InvalidArgument):
        zoo_at.get(R18, weights=str(tmp_path / "later.safetensors"), dtype="int8", dispatch="lazy")
    assert os.listdir(tmp_path) == []


def test_fully_shard_of_a_lazy_module_loads_it_whole_first_and_trains_as_eager(zoo_at, tmp_path):
    """fully_shard (torch's composable contract) lists the module's parameters, which is a use: the lazy
    module loads whole, then FSDP2 shards it (the README says to shard a non-lazy module, then
    materialize: each rank then reads only its rows). One gloo rank in this process."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'fsdp'}", rank=0, world_size=1)
    try:
        m, eager = lazy(zoo_at, tmp_path)
        fully_shard(m)
        assert not on_meta(m) and m.materialize.pending is None
        x = example_input(R18)
        m(x).sum().backward()
        eager(x).sum().backward()
        assert all(torch.equal(p.grad.full_tensor(), q.grad) for p, q in zip(m.parameters(), eager.parameters()))
    finally:
        dist.destroy_process_group()
