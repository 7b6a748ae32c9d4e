"""Small user builders for the tests: `zoo index builder tests.builders:NAME`."""

import os
import time
from pathlib import Path

import torch
from torch import nn


class TiedNet(nn.Module):
    """An encoder and decoder sharing one weight, a non-persistent buffer, and tensors made with device="cpu"."""

    def __init__(self, dim: int = 8, vocab: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, device="cpu")
        self.proj = nn.Linear(dim, dim).to("cpu")
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as in language models
        self.register_buffer("positions", torch.arange(vocab, device="cpu"), persistent=False)
        self.register_buffer("scale", torch.full((dim,), 0.5, device="cpu"))
        nn.init.trunc_normal_(self.proj.weight, std=0.02)

    def forward(self, ids):
        return self.head(self.proj(self.embed(ids)) * self.scale)


def tied_net(dim: int = 8, vocab: int = 32) -> TiedNet:
    return TiedNet(dim, vocab)


def broken(**kwargs):
    raise RuntimeError("this builder always fails")


def reads_values() -> nn.Module:
    """Reads tensor values while building, as timm's drop-path schedules do."""
    rates = [x.item() for x in torch.linspace(0, 0.1, 4, device="cpu")]
    net = nn.Sequential(*[nn.Linear(4, 4) for _ in rates])
    net.register_buffer("rates", torch.tensor(rates), persistent=False)
    return net


def downloads() -> nn.Module:
    """A builder that fetches weights while building, as torchvision's backbones do by default."""
    net = nn.Linear(2, 2)
    net.load_state_dict(torch.hub.load_state_dict_from_url("http://127.0.0.1:9/weights.pth"))
    return net


def hub_status() -> nn.Module:
    """Records whether huggingface_hub is offline while it builds (is_offline_mode: what its HTTP layer and
    transformers ask at each call; HF_HUB_OFFLINE is read once, at import)."""
    from huggingface_hub import constants

    net = nn.Linear(2, 2)
    net.hub_offline = constants.is_offline_mode()
    return net


HELD: dict[str, dict] = {}  # a test's gate: {"entered": Event, "release": Event, "inside": callable}


def held(gate: str) -> nn.Module:
    """Sets HELD[gate]["entered"], waits (a minute at most) for HELD[gate]["release"], then calls
    HELD[gate]["inside"]() in its build: a test holds a build open while another thread works."""
    hold = HELD[gate]
    hold["entered"].set()
    if not hold["release"].wait(60):
        raise TimeoutError(f"gate {gate} was never released")
    hold["inside"]()
    return nn.Linear(2, 2)


def shipped_weights_net(path: str):
    """A model whose constructor loads weights shipped beside it, as facenet-pytorch or lpips do ("": none)."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    if path:
        net[2].load_state_dict(torch.load(path, map_location="cpu"))
    return net


class ConvNet(nn.Module):
    """A convolution and a classifier: a user model whose FLOPs follow from its shapes by hand."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 32 * 32, classes)

    def forward(self, x):
        return self.head(self.conv(x).relu().flatten(1))


def conv_net(classes: int = 10) -> ConvNet:
    return ConvNet(classes)


def gated_net(gate: str, started: str) -> nn.Module:
    """Builds only once the file `gate` is gone (at most 5 min), having written its process id to `started`: a
    request that builds this model holds the server's heavy-work slot for as long as a test needs."""
    Path(started).write_text(str(os.getpid()))
    deadline = time.monotonic() + 300
    while Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return ConvNet()
