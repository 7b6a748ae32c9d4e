"""User builders whose forward fails on a real device (never on meta, so that indexing analyses them as it does any
model): what `zoo bench` meets in models whose code asserts, indexes or looks up at run time."""

import torch
from torch import nn


class FailsWhenRun(nn.Module):
    def __init__(self, failure: str):
        super().__init__()
        self.failure = failure
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        if y.device.type == "meta":
            return y
        if self.failure == "assert" and y.shape[0] < 2:  # a model's `assert`, raised under python -O too
            raise AssertionError("this model needs a batch of 2 or more")
        if self.failure == "index":
            return y[:, [99]]  # IndexError: index 99 is out of bounds for dimension with size 4
        if self.failure == "key":
            return {"logits": y}["probabilities"]
        if self.failure == "memory":  # 1 PiB: past any machine's memory, refused at once
            return y + torch.empty(1 << 50, dtype=torch.uint8, device=y.device).sum()
        return y


def failing(failure: str) -> FailsWhenRun:
    return FailsWhenRun(failure)
