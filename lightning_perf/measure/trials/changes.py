"""The changes an A/B trial can switch on and off in a running process, each with the check that it may.

No Lightning import: a change sees the module, the device type and the Trainer's precision (a :class:`Setting`). A
change that cannot be toggled safely, or would change nothing, is refused at set-up with :class:`PerfConfigError`
naming it; never mid-training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from lightning_perf.errors import PerfConfigError
from lightning_perf.measure.trials.blocks import BUILT_IN_CHANGES
from lightning_perf.measure.trials.spec import SWITCH_FORMS, is_switch_spec, load_switches

__all__ = ["BUILT_IN", "Change", "Refused", "Setting", "make_change"]

#: The built-in changes, by name (docs/trials.md).
BUILT_IN = BUILT_IN_CHANGES
MATMUL_PRECISIONS = ("highest", "high", "medium")


@dataclass
class Setting:
    """What a change is checked against, at set-up."""

    module: Any
    device_type: str  # "cuda", "cpu", "mps", ...
    precision: str  # the Trainer's, e.g. "32-true"


class Change:
    """One change: ``on``/``off`` switch it between two iterations; ``around_step`` (where not None) wraps each
    training step while it is on (inputs in another layout, autocast)."""

    name = ""
    around_step: Optional[Callable[..., Any]] = None

    def check(self, setting: Setting) -> None:
        """Raises :class:`PerfConfigError` where the change cannot be tried in this run."""

    def on(self, module: Any) -> None:
        raise NotImplementedError

    def off(self, module: Any) -> None:
        raise NotImplementedError

    def refuse(self, why: str) -> PerfConfigError:
        return PerfConfigError(f"ABTrial(change={self.name!r}) cannot be tried in this run: {why}")


class _Flags(Change):
    """Backend flags: ``on`` sets them, ``off`` puts back what they were at set-up."""

    needs_cuda = True

    def read(self) -> Any:
        raise NotImplementedError

    def write(self, value: Any) -> None:
        raise NotImplementedError

    target: Any = True

    def check(self, setting: Setting) -> None:
        if self.needs_cuda and setting.device_type != "cuda":
            raise self.refuse(f"it acts on CUDA kernels only and this Trainer runs on {setting.device_type!r}")
        self._before = self.read()
        if self._before == self.target:
            raise self.refuse(f"it is already on ({self._before!r}) at set-up, so both arms would run the same")

    def on(self, module: Any) -> None:
        self.write(self.target)

    def off(self, module: Any) -> None:
        self.write(self._before)


class CudnnBenchmark(_Flags):
    name = "cudnn_benchmark"

    def read(self) -> Any:
        return bool(torch.backends.cudnn.benchmark)

    def write(self, value: Any) -> None:
        torch.backends.cudnn.benchmark = value


class TF32(_Flags):
    name = "tf32"
    target = (True, True)

    def read(self) -> Any:
        return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)

    def write(self, value: Any) -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = value


class MatmulPrecision(_Flags):
    name = "matmul_precision"
    needs_cuda = False  # on CPU it picks oneDNN's reduced-precision float32 matmuls where the CPU has them

    def __init__(self, value: Optional[str]) -> None:
        value = "high" if value is None else value
        if value not in MATMUL_PRECISIONS:
            raise PerfConfigError(f"Unsupported parameter value `ABTrial(value={value!r})` for matmul_precision."
                                  f" Possible choices are: {', '.join(MATMUL_PRECISIONS)}.")
        self.target = value

    def read(self) -> Any:
        return torch.get_float32_matmul_precision()

    def write(self, value: Any) -> None:
        torch.set_float32_matmul_precision(value)


def _to_channels_last(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.contiguous(memory_format=torch.channels_last) if value.dim() == 4 else value
    if isinstance(value, (list, tuple)):
        converted = [_to_channels_last(v) for v in value]
        return type(value)(converted) if isinstance(value, list) or not hasattr(value, "_fields") else \
            type(value)(*converted)
    if isinstance(value, dict):
        return {k: _to_channels_last(v) for k, v in value.items()}
    return value


class ChannelsLast(Change):
    """The module's 4-d weights and the step's 4-d inputs in ``channels_last``. The parameters stay the same objects
    (``Module.to`` changes their ``.data``), so the optimizer keeps them and its state."""

    name = "channels_last"

    def check(self, setting: Setting) -> None:
        if torch.__future__.get_overwrite_module_params_on_conversion():
            raise self.refuse("`torch.__future__.set_overwrite_module_params_on_conversion(True)` is set, so a layout"
                              " change would replace the parameters the optimizer holds and training would break")
        if not any(p.dim() == 4 for p in setting.module.parameters()):
            raise self.refuse("the module has no 4-d weights (convolutions), so the layout would change nothing")

    def on(self, module: Any) -> None:
        module.to(memory_format=torch.channels_last)

    def off(self, module: Any) -> None:
        module.to(memory_format=torch.contiguous_format)

    @staticmethod
    def around_step(step: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        return step(*_to_channels_last(args), **kwargs)


class Autocast(Change):
    """``torch.autocast`` around ``training_step`` (forward and loss; backward follows autocast's own rule)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.name = "autocast_bf16" if dtype == torch.bfloat16 else "autocast_fp16"
        self._device_type = "cpu"

    def check(self, setting: Setting) -> None:
        if setting.precision not in ("32-true", "32"):
            raise self.refuse(f"the Trainer's precision is {setting.precision!r}; autocast is tried only against"
                              " precision 32 (a mixed precision plugin already runs its own autocast)")
        if self.dtype == torch.float16 and setting.device_type != "cuda":
            raise self.refuse(f"float16 autocast is tried on CUDA only; this Trainer runs on {setting.device_type!r}")
        if setting.device_type not in ("cuda", "cpu"):
            raise self.refuse(f"autocast is tried on cuda and cpu only, not {setting.device_type!r}")
        self._device_type = setting.device_type

    def on(self, module: Any) -> None:
        pass

    def off(self, module: Any) -> None:
        pass

    def around_step(self, step: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        with torch.autocast(self._device_type, dtype=self.dtype):
            return step(*args, **kwargs)


class UserChange(Change):
    """A pair of the user's functions, each called with ``(trainer, pl_module)`` between two iterations."""

    def __init__(self, name: str, switch_on: Callable[..., Any], switch_off: Callable[..., Any]) -> None:
        self.name, self._on, self._off = name, switch_on, switch_off
        self.trainer: Any = None

    def on(self, module: Any) -> None:
        self._on(self.trainer, module)

    def off(self, module: Any) -> None:
        self._off(self.trainer, module)


class Refused(Change):
    """A change that could not be made (``run --trial`` of a module the command's Python cannot import): refused at
    set-up with the reason it could not, so the attached trial records it and the fit runs without it."""

    def __init__(self, name: str, why: str) -> None:
        self.name, self.why = name, why

    def check(self, setting: Setting) -> None:
        raise PerfConfigError(self.why)


def make_change(name: str, value: Optional[str] = None, switch_on: Optional[Callable[..., Any]] = None,
                switch_off: Optional[Callable[..., Any]] = None) -> Change:
    """The change ``name``: a built-in one, the user's ``switch_on``/``switch_off`` under any other name, or, without
    them, the user's switches by import path (``mypkg.switches:on,off`` or ``mypkg.switches:Change``)."""
    if switch_on is None and switch_off is None and is_switch_spec(name):
        try:
            switch_on, switch_off = load_switches(name)
        except ValueError as err:
            raise PerfConfigError(f"ABTrial(change={name!r}) cannot be used: {err}") from None
        return UserChange(name, switch_on, switch_off)
    if switch_on is not None or switch_off is not None:
        if not (callable(switch_on) and callable(switch_off)):
            raise PerfConfigError(f"ABTrial(change={name!r}): give both `switch_on` and `switch_off` as functions"
                                  " of (trainer, pl_module), or neither for a built-in change.")
        if name in BUILT_IN:
            raise PerfConfigError(f"ABTrial(change={name!r}): that is a built-in change's name; name your own"
                                  " change otherwise.")
        return UserChange(name, switch_on, switch_off)
    if value is not None and name != "matmul_precision":
        raise PerfConfigError(f"ABTrial(value={value!r}): `value` is for change='matmul_precision' only.")
    if name == "cudnn_benchmark":
        return CudnnBenchmark()
    if name == "tf32":
        return TF32()
    if name == "matmul_precision":
        return MatmulPrecision(value)
    if name == "channels_last":
        return ChannelsLast()
    if name in ("autocast_bf16", "autocast_fp16"):
        return Autocast(torch.bfloat16 if name == "autocast_bf16" else torch.float16)
    raise PerfConfigError(f"Unsupported parameter value `ABTrial(change={name!r})`. Possible choices are:"
                          f" {', '.join(BUILT_IN)}, any name with `switch_on` and `switch_off` functions, or"
                          f" {SWITCH_FORMS}.")
