"""Analysis without weights: FLOPs, activation memory and output shapes from forwards on the meta device.

Nothing here reads a weight or allocates one: a model built on meta runs its own forward on meta
tensors, which computes every shape and dtype and no value. Three things are measured:

* FLOPs and MACs: ``torch.utils.flop_counter.FlopCounterMode``'s formulas over an inference forward at
  batch 1, counted inside ``LiveBytes`` as FlopCounterMode counts them: 2 FLOPs per multiply-accumulate
  in matmuls, convolutions and attention (and nothing for elementwise ops, norms or pooling), so
  ``macs = flops // 2`` and MACs are what torchvision publishes as "GFLOPS".
* Activation bytes: in training mode, the tensors autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), counted once per storage; in inference, the peak
  of live activation storages during an eval, no-grad forward (``LiveBytes``). Weights, buffers and
  the model's inputs are not activations and are not counted.
* Output shapes and dtypes of the model's output (``analyze``) or of every module (``scan``).

Modules: inputs (specs -> example inputs), meters (live/saved bytes, FLOPs, fused attention),
forward (what every meta forward shares), index_time (``analyze``: a registry row's figures),
shapes (``scan``), memory (``estimate``). Everything here takes a module; resolving a registered
name is the API's (zoo.scan, zoo.estimate, zoo.Zoo).
"""

from zoo.analysis.forward import loss_of, outputs_of
from zoo.analysis.index_time import DEFAULT_BUDGET_S, SCAN_ERROR, SCAN_NO_INPUT, SCAN_OK, Analysis, analyze
from zoo.analysis.inputs import input_spec_of, make_inputs
from zoo.analysis.memory import OPTIMIZERS, Estimate, estimate, make_optimizer, measure_step
from zoo.analysis.meters import FusedAttention, LiveBytes, SavedBytes, flop_counter
from zoo.analysis.shapes import ModuleScan, Scan, scan

__all__ = [
    "Analysis",
    "analyze",
    "DEFAULT_BUDGET_S",
    "SCAN_OK",
    "SCAN_ERROR",
    "SCAN_NO_INPUT",
    "make_inputs",
    "input_spec_of",
    "outputs_of",
    "loss_of",
    "LiveBytes",
    "SavedBytes",
    "FusedAttention",
    "flop_counter",
    "Scan",
    "ModuleScan",
    "scan",
    "Estimate",
    "estimate",
    "measure_step",
    "make_optimizer",
    "OPTIMIZERS",
]
