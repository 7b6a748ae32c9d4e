"""A build's effects are its own: while one thread is inside a meta build (held there by
tests.builders:held), another thread downloads, loads and goes online exactly as before; the build
itself is refused the download and is offline; and after a build that raises, nothing of it is left."""

import os
import threading

import pytest
import torch
from huggingface_hub import constants
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.utils import get_session

from tests import builders
from zoo.build import build_meta
from zoo.errors import BuildFailed, DownloadBlocked
from zoo.families import timm_loader
from zoo.recipe import Recipe

UNREACHABLE = "http://127.0.0.1:9/"  # the discard port: nothing listens, the connection is refused at once


def _raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    return None


@pytest.fixture
def online(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # whatever the environment says


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "w.pth"
    torch.save({"w": torch.arange(3.0)}, path)
    return path


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:
            out["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _held_build(gate: str, inside):
    hold = builders.HELD[gate] = {"entered": threading.Event(), "release": threading.Event(), "inside": inside}
    thread, out = _in_thread(
        lambda: build_meta(Recipe("user", "tests.builders:held", {"gate": gate}), trusted={"tests"})
    )
    assert hold["entered"].wait(60), out
    return hold, thread, out


def _outside_a_build_all_is_as_before(tmp_path, weights, env):
    """What a thread outside any build sees: the real download, real loads, huggingface_hub online."""
    copy = tmp_path / "outside.pth"
    torch.hub.download_url_to_file(weights.as_uri(), str(copy), progress=False)
    assert torch.equal(torch.load(copy)["w"], torch.arange(3.0))  # values, not meta
    assert constants.is_offline_mode() is False
    assert os.environ.get("HF_HUB_OFFLINE") == env
    error = _raised(lambda: get_session().get(UNREACHABLE))
    assert error is not None and not isinstance(error, OfflineModeIsEnabled), error  # it tried the network


def test_a_build_in_one_thread_changes_nothing_for_another(tmp_path, weights, online):
    env = os.environ.get("HF_HUB_OFFLINE")
    seen = {}

    def inside():  # in the held build, once the other thread has done its checks
        seen["download"] = _raised(lambda: torch.hub.download_url_to_file(weights.as_uri(), str(tmp_path / "in.pth")))
        seen["offline"] = constants.is_offline_mode()
        seen["request"] = _raised(lambda: get_session().get(UNREACHABLE))
        seen["load"] = torch.load(weights)["w"]

    hold, thread, out = _held_build("other-thread", inside)
    try:
        _outside_a_build_all_is_as_before(tmp_path, weights, env)
    finally:
        hold["release"].set()
        thread.join(60)
    assert "error" not in out, out
    assert isinstance(seen["download"], DownloadBlocked) and "builds never download" in str(seen["download"])
    assert seen["offline"] is True
    assert isinstance(seen["request"], OfflineModeIsEnabled)
    assert seen["load"].is_meta
    assert not (tmp_path / "in.pth").exists()


def test_two_builds_at_once_each_stay_offline_and_leave_nothing(tmp_path, weights, online):
    """Overlapping builds that end in the other order: neither ends the other's scope, and after both the
    library functions behave as before (swaps restored out of order left one build's swap in place)."""
    seen = {}

    def inside(name):
        def check():
            seen[name] = (
                _raised(lambda: torch.hub.download_url_to_file(weights.as_uri(), str(tmp_path / name))),
                constants.is_offline_mode(),
            )

        return check

    first, first_thread, first_out = _held_build("first", inside("first"))
    second, second_thread, second_out = _held_build("second", inside("second"))
    first["release"].set()
    first_thread.join(60)
    second["release"].set()
    second_thread.join(60)
    assert "error" not in first_out and "error" not in second_out, (first_out, second_out)
    for name in ("first", "second"):
        assert isinstance(seen[name][0], DownloadBlocked) and seen[name][1] is True
    _outside_a_build_all_is_as_before(tmp_path, weights, os.environ.get("HF_HUB_OFFLINE"))


def test_after_a_build_that_raises_nothing_of_it_is_left(tmp_path, weights, online):
    env = os.environ.get("HF_HUB_OFFLINE")
    threads = torch.get_num_threads()
    with pytest.raises(BuildFailed, match="this builder always fails"):
        build_meta(Recipe("user", "tests.builders:broken"), trusted={"tests"})
    with pytest.raises(DownloadBlocked):
        build_meta(Recipe("user", "tests.builders:downloads"), trusted={"tests"})
    _outside_a_build_all_is_as_before(tmp_path, weights, env)  # in the thread that built
    assert torch.get_num_threads() == threads


def _held_relu():
    """An act_layer for timm's resnet18 whose first instance waits, inside timm's build, for the test."""

    class HeldReLU(torch.nn.ReLU):
        entered = threading.Event()
        release = threading.Event()

        def __init__(self, *args, **kwargs):
            if not self.entered.is_set():
                self.entered.set()
                assert self.release.wait(60)
            super().__init__(*args, **kwargs)

    return HeldReLU


class _FailingReLU(torch.nn.ReLU):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("no activation today")


def _loads_for_real(tmp_path):
    """timm's load_pretrained, called outside any catch, loads the file into the model."""
    import timm
    from timm.models import _builder

    torch.manual_seed(0)
    source = timm.create_model("resnet18")
    path = tmp_path / "resnet18.pth"
    torch.save(source.state_dict(), path)
    torch.manual_seed(1)
    model = timm.create_model("resnet18")
    cfg = {"file": str(path), "num_classes": 1000, "classifier": "fc", "first_conv": "conv1"}
    _builder.load_pretrained(model, pretrained_cfg=cfg, num_classes=1000, in_chans=3, strict=True)
    assert torch.equal(model.conv1.weight, source.conv1.weight)


def test_catching_timm_arguments_leaves_load_pretrained_to_other_threads(tmp_path):
    pytest.importorskip("timm")
    held = _held_relu()
    thread, out = _in_thread(lambda: timm_loader._catch("resnet18", {"act_layer": held}))
    try:
        assert held.entered.wait(60), out
        _loads_for_real(tmp_path)  # while the other thread is inside its catch
    finally:
        held.release.set()
        thread.join(60)
    assert "error" not in out, out
    assert (out["value"]["num_classes"], out["value"]["cfg"]["architecture"]) == (1000, "resnet18")


def test_a_catch_that_raises_leaves_load_pretrained_as_it_was(tmp_path):
    pytest.importorskip("timm")
    with pytest.raises(RuntimeError, match="no activation today"):
        timm_loader._catch("resnet18", {"act_layer": _FailingReLU})
    _loads_for_real(tmp_path)
