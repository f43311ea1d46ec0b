"""FLOPs of one training batch and model FLOPs utilisation: a side-effect-free copy to count on, and the arithmetic."""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, Mapping, Optional

import torch

__all__ = ["PRECISION_DTYPES", "count_step_flops", "held_graphs", "meta_copy", "mfu_pct", "precision_dtype",
           "tflops_per_s"]

#: The compute dtype of each precision setting a Trainer accepts (``trainer.precision``): what the device's peak
#: FLOP/s is looked up for.
PRECISION_DTYPES = {
    "64-true": torch.float64, "64": torch.float64, "double": torch.float64,
    "32-true": torch.float32, "32": torch.float32,
    "16-mixed": torch.float16, "16-true": torch.float16, "16": torch.float16, "half": torch.float16,
    "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16, "bf16": torch.bfloat16,
}


def precision_dtype(precision: Any) -> Optional[torch.dtype]:
    """The dtype whose peak FLOP/s bounds a run at ``precision`` (``"bf16-mixed"`` -> bfloat16), None if unknown."""
    return PRECISION_DTYPES.get(str(precision))


def tflops_per_s(flops_per_batch: Optional[float], batches: int, seconds: float) -> Optional[float]:
    """TFLOP/s of ``batches`` batches of ``flops_per_batch`` FLOPs each done in ``seconds``; None when unknown."""
    if flops_per_batch is None or seconds <= 0 or batches <= 0:
        return None
    return flops_per_batch * batches / seconds / 1e12


def mfu_pct(tflops: Optional[float], available_flops: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation in percent: achieved FLOP/s over the device's peak FLOP/s."""
    if tflops is None or not available_flops:
        return None
    return 100.0 * tflops * 1e12 / available_flops


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor, device="meta")


def to_meta(batch: Any) -> Any:
    """``batch`` with every tensor (in nested lists, tuples and dicts) replaced by an empty one on the meta device."""
    if isinstance(batch, torch.Tensor):
        return _meta_like(batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_meta(v) for k, v in batch.items()}) if isinstance(batch, dict) else {
            k: to_meta(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_meta(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_meta(v) for v in batch)
    return batch


#: Module attributes that hold its parameters, buffers and submodules: the copies deal with those themselves.
_OWN_STATE = frozenset({"_parameters", "_buffers", "_modules"})


def held_graphs(module: torch.nn.Module, depth: int = 3) -> dict:
    """id -> tensor for every tensor with an autograd graph (not a leaf) that ``module`` or a submodule holds in an
    attribute, or in lists, tuples and dicts there (``depth`` levels, as EvalNoGradGuard's retained-graph check
    looks): ``copy.deepcopy`` refuses such a tensor, so a model that keeps its losses with their graphs could not be
    copied to count on."""
    from lightning_perf.measure.evaluation.autograd import tensors_with_graphs

    found: dict = {}
    for sub in module.modules():
        for name, value in vars(sub).items():
            if name not in _OWN_STATE:
                for tensor in tensors_with_graphs(value, depth):
                    found[id(tensor)] = tensor
    return found


def _copy_memo(module: torch.nn.Module, keep: Iterable[Any], meta: bool) -> dict:
    """The memo a copy starts from: the objects in ``keep`` shared, and each tensor with a graph that the module
    holds given to the copy as its own tensor without the graph (on the meta device for the meta copy; else a
    detached clone, which the copy's step may change in place, ``self.total += loss``, leaving the model's as it
    was)."""
    memo = {id(obj): obj for obj in keep}
    for key, tensor in held_graphs(module).items():
        memo[key] = _meta_like(tensor) if meta else tensor.detach().clone()
    return memo


def meta_copy(module: torch.nn.Module, keep: Iterable[Any] = ()) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters and buffers live on the meta device (no memory, no compute); the
    objects in ``keep`` (the trainer it points at) are shared, not copied, and tensors with a graph that it holds
    are copied detached."""
    memo = _copy_memo(module, keep, meta=True)
    for param in module.parameters():
        memo[id(param)] = torch.nn.Parameter(_meta_like(param), requires_grad=param.requires_grad)
    for buf in module.buffers():
        memo[id(buf)] = _meta_like(buf)
    return copy.deepcopy(module, memo)


def _loss_of(output: Any) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, torch.Tensor):
        raise ValueError(f"training_step returned {type(output).__name__}, not a loss tensor or a dict with 'loss'")
    return loss


def count_step_flops(
    module: torch.nn.Module,
    step: Callable[[torch.nn.Module, Any], Any],
    batch: Any,
    measure: Callable[..., int],
    keep: Iterable[Any] = (),
    silence: Iterable[str] = (),
) -> int:
    """FLOPs of ``step(module_copy, batch)`` and the backward of the loss it returns, counted by ``measure``
    (Lightning's ``measure_flops``: torch's ``FlopCounterMode`` underneath) on a copy of ``module``, so the module's
    parameters, gradients, buffers and attributes, and the random number generators, are as they were.

    First on a copy on the meta device (no memory, no device time). A step that cannot run there (it reads a value,
    calls an op without a meta kernel) is counted on a full copy on the module's own device, with the random states
    saved and restored. Methods named in ``silence`` (``log``, ``log_dict``) do nothing on the copy.

    Raises:
        Exception: whatever the step raises on the full copy; the caller records it.
    """
    keep = list(keep)

    def run(copied: torch.nn.Module, data: Any) -> int:
        for name in silence:
            setattr(copied, name, lambda *args, **kwargs: None)
        with torch.enable_grad():
            return int(measure(copied, lambda: step(copied, data), lambda out: _loss_of(out)))

    try:
        return run(meta_copy(module, keep), to_meta(batch))
    except Exception:  # noqa: BLE001 - not countable on meta: count on a real copy below
        pass
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        return run(copy.deepcopy(module, _copy_memo(module, keep, meta=False)), batch)
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.synchronize()  # once per run: the copy's work stays out of the measured iterations
            torch.cuda.set_rng_state_all(cuda_rng)


def peak_flops(available_flops: Optional[float], flops_per_batch: Any, precision: Any, device: torch.device,
               lookup: Callable[[torch.device, torch.dtype], Optional[float]]) -> tuple:
    """The device's peak FLOP/s at the run's precision: (peak, its source, why unknown, the dtype's name).
    ``lookup``: Lightning's ``get_available_flops`` (it knows CUDA GPUs and TPUs)."""
    dtype = precision_dtype(precision)
    dtype_name = str(dtype).replace("torch.", "") if dtype is not None else None
    if available_flops is not None:
        return float(available_flops), "argument", None, dtype_name
    if flops_per_batch is None:
        return None, None, "no `flops_per_batch` given, so no FLOP/s to compare with the device's peak", dtype_name
    if dtype is None:
        return None, None, (f"the compute dtype of precision {precision!r} is not known here: pass"
                            " `IterationTimer(available_flops=...)`, the device's peak FLOP/s"), dtype_name
    if device.type not in ("cuda", "xla"):
        return None, None, (f"the peak FLOP/s of a {device.type} device is unknown (Lightning's get_available_flops"
                            " knows CUDA GPUs and TPUs): pass `IterationTimer(available_flops=...)`, the device's"
                            " peak FLOP/s"), dtype_name
    peak = lookup(device, dtype)
    if peak:
        return float(peak), "get_available_flops", None, dtype_name
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return None, None, (f"the peak FLOP/s of {name} at {dtype_name} is not in Lightning's get_available_flops: pass"
                        " `IterationTimer(available_flops=...)`"), dtype_name
