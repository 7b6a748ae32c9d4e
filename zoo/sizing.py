"""Zoo's questions of size: every module's outputs (scan), the bytes of one run (estimate), and a run planned on
hardware under DDP, FSDP2 and TP (plan); each of a registered model or of a module zoo.get returned. A base of
zoo.api.Zoo, kept apart so that each module stays one job."""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing: 2 ms of every `zoo search` process

if TYPE_CHECKING:
    from torch import nn

    from zoo.analysis import Estimate, Scan
    from zoo.model_info import ModelInfo
    from zoo.planning import Plan


class Sizing:
    """scan, estimate and plan over a Zoo's registry."""

    if TYPE_CHECKING:

        def info(self, name: str, tensors: bool = False) -> ModelInfo: ...

        def _module(self, name_or_module) -> nn.Module: ...

    def scan(self, name_or_module, *inputs, **options) -> Scan:
        """Every submodule's output shapes and dtypes from one forward on meta, no weights.

        Args:
            name_or_module: a model's name, or a module from zoo.get.
            *inputs: input tensors or shapes ((1, 3, 224, 224)), or a text for a registered hf model; none: the
                row's recorded input.
            **options: those of zoo.analysis.scan (depth, ...).

        Returns:
            A Scan (one row per submodule: its path, class, output shapes and dtypes).

        Raises:
            ModelNotFound: no such model.
            AnalysisError: no input to run with, or a model that cannot run on meta.
            TokenizerNotCached: a text for a model whose tokenizer is not in the hub cache.
        """
        from zoo.analysis import scan

        module = self._module(name_or_module)
        if any(isinstance(i, str) for i in inputs):
            full = self.info(name_or_module).name if isinstance(name_or_module, str) else None
            from zoo.analysis.inputs import tokenized

            return scan(module, **tokenized(full, module, inputs), **options)
        return scan(module, *inputs, **options)

    def estimate(self, name_or_module, **options) -> Estimate:
        """Bytes to run a model: weights, gradients, optimizer states, KV cache and activations, measured by running it
        on meta at the batch asked (not scaled from batch 1).

        Args:
            name_or_module: a model's name, or a module from zoo.get.
            **options: zoo.analysis.memory.EstimateOptions: batch (1), dtype ("bf16"), training (False), optimizer
                ("adamw", "adam", "sgd", "none"), seq_len (the row's), kv_dtype (the KV cache's: "fp8"),
                weights_dtype (weight-only quantization: "int8", "int4" with group_size, "fp8"), group_size (128),
                checkpointing (training with activation checkpointing), amp (autocast to dtype over fp32
                parameters), input_size (a vision model's (C, H, W)).

        Returns:
            An Estimate: each term in bytes, their total and the peak.

        Raises:
            InvalidArgument: an unknown option.
            AnalysisError: an option out of range, or a model that cannot run on meta.
            ModelNotFound: no such model.

        Examples:
            >>> zoo.estimate("timm/resnet50", batch=32, training=True).total > 0
            True
        """
        from zoo.analysis import estimate
        from zoo.analysis.memory import EstimateOptions

        EstimateOptions.of(options).checked()  # refused before the model is built
        name = name_or_module if isinstance(name_or_module, str) else None
        return estimate(self._module(name_or_module), name=name, **options)

    def plan(self, name_or_module, **options) -> Plan:
        """What a run needs per device under DDP, FSDP2 and TP, whether it fits, the largest batch that does and a
        step time: model states from the tensor table, activations fitted from meta runs (zoo.planning says how).

        Args:
            name_or_module: a model's name, or a module from zoo.get.
            **options: zoo.planning.PlanOptions: hardware, devices, training, batch, seq_len, input_size, dtype,
                optimizer, fsdp, tp, checkpointing, kv_dtype (zoo.plan says what each takes).

        Returns:
            A Plan: per_device bytes, capacity, fits, max_batch, max_context, max_tokens, step_seconds.

        Raises:
            InvalidArgument: an invalid option or layout (fsdp x tp must divide devices, tp the heads).
            HardwareNotFound: hardware that is neither a listed device nor an amount of memory.
            ModelNotFound: no such model.
            AnalysisError: a model that cannot run on meta.

        Examples:
            >>> zoo.plan("timm/resnet50", hardware="RTX 4090", training=True, dtype="amp-bf16").fits
            True
        """
        from zoo.planning import PlanOptions, plan, recorded_activations

        o = PlanOptions.of(options).checked()  # refused before the model is built
        if isinstance(name_or_module, str):  # what zoo index recorded: no module built
            row = self.info(name_or_module)
            recorded = recorded_activations(row, o)
            if recorded is not None and row.plan_shapes:
                return plan(row.name, row.plan_shapes, row, o, recorded)
        return self._measured_plan(name_or_module, o)

    def _measured_plan(self, name_or_module, o) -> Plan:
        """A plan whose activations are measured now on meta: a mode or input size the row records none for."""
        from zoo.inspection import inspect_module
        from zoo.planning import fit_activations, measurer, plan, row_seq, shape_groups
        from zoo.state import state_of

        state = None if isinstance(name_or_module, str) else state_of(name_or_module)
        name = name_or_module if isinstance(name_or_module, str) else (state.name if state else None)
        row, module = self.info(name, tensors=True) if name else None, self._module(name_or_module)
        table = row.tensor_table if row is not None and row.tensor_table else inspect_module(module).tensor_table
        measure = measurer(lambda **kw: self.estimate(module, **kw), o)  # activations on meta
        activations = fit_activations(measure, o.seq_len or row_seq(row))
        return plan(row.name if row else type(module).__name__, shape_groups(table), row, o, activations)
