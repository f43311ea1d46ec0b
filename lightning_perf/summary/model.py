"""The one typed definition of perf_summary.json: validation on read, the JSON Schema and the docs' field table.

Every field a reader of the summary uses (``compare``, ``report``, ``matrix``) is declared here with its type and
range: times, sizes and counts are finite and >= 0, flags are booleans, names and messages are strings. Any field
may be null or absent (a figure that could not be measured is null), and fields this version does not know are
kept (a newer writer's file still reads). Schema versions 1 and 2 read alike. Pure Python: no torch.

:mod:`lightning_perf.summary.derived` makes ``docs/perf_summary.schema.json`` and the field table of
``docs/summary.md`` from these classes (``python -m lightning_perf.summary.derived --write``); a test fails when the
committed files differ.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Callable, Dict, List, Literal, Mapping, Optional, Tuple, Union

from annotated_types import Ge, Le
from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from lightning_perf.summary.schema import SCHEMA_VERSION, STATUSES, SummaryError

#: Integers beyond this are no count a run can reach; they are refused before any arithmetic overflows.
MAX_INT = 2**63 - 1


# -- how a bad value is shown and refused --------------------------------------------------------------------------

def show(value: Any) -> str:
    """A bad value as a short piece of one line: JSON spellings for NaN/Infinity/null/booleans, no deep reprs."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int):
        digits = len(str(abs(value))) if abs(value) < 10**50 else None
        return str(value) if digits is not None else "an integer of more than 50 digits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:40] + "..."
        return repr(text).encode("ascii", "backslashreplace").decode("ascii")
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _refuse(reason: str) -> PydanticCustomError:
    return PydanticCustomError("summary_field", "{reason}", {"reason": reason})


def _number(integer: bool = False, ge: Optional[float] = None, null: bool = True,
            le: Optional[float] = None) -> Callable[[Any], Any]:
    """The check of one numeric field: the type first (booleans are no numbers), then finite, then the range."""
    kind = ("an integer" if integer else "a number") + (" or null" if null else "")
    rule = f"{'an integer' if integer else 'a finite number'}" + (
        f" from {ge:g} to {le:g}" if ge is not None and le is not None else f" >= {ge:g}" if ge is not None else "")

    def check(value: Any) -> Any:
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _refuse(f"must be {kind}, got {show(value)}")
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise _refuse(f"must be {rule}, got {show(value)} (beyond {MAX_INT})")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _refuse(f"must be {rule}, got {show(value)}")
            if integer:
                if not value.is_integer() or abs(value) > MAX_INT:
                    raise _refuse(f"must be {rule}, got {show(value)}")
                value = int(value)
        if (ge is not None and value < ge) or (le is not None and value > le):
            raise _refuse(f"must be {rule}, got {show(value)}")
        return value

    return check


def _typed(python_type: type, what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None or (isinstance(value, python_type) and not (python_type is int and isinstance(value, bool))):
            return value
        raise _refuse(f"must be {what} or null, got {show(value)}")

    return check


def _text_item(value: Any) -> Any:
    if isinstance(value, str):
        return value
    raise _refuse(f"must be a string, got {show(value)}")


def _obj(value: Any) -> Any:
    if value is None or isinstance(value, Mapping):
        return value
    raise _refuse(f"must be an object or null, got {show(value)}")


def _seq(value: Any) -> Any:
    if value is None or isinstance(value, list):
        return value
    raise _refuse(f"must be a list or null, got {show(value)}")


# Field types. Each is nullable: a figure that could not be measured is null, with its reason under `unavailable`.
FiniteFloat = Annotated[float, AllowInfNan(False)]
Real = Annotated[Optional[FiniteFloat], BeforeValidator(_number())]
NonNegative = Annotated[Optional[Annotated[FiniteFloat, Ge(0)]], BeforeValidator(_number(ge=0))]
#: A share of a whole (of the wall time, of the samples, of the cores): what the writer clamps to 0..100.
Share = Annotated[Optional[Annotated[FiniteFloat, Ge(0), Le(100)]], BeforeValidator(_number(ge=0, le=100))]
Count = Annotated[Optional[Annotated[int, Ge(0), Le(MAX_INT)]], BeforeValidator(_number(integer=True, ge=0))]
Positive = Annotated[Optional[Annotated[int, Ge(1), Le(MAX_INT)]], BeforeValidator(_number(integer=True, ge=1))]
Integer = Annotated[Optional[Annotated[int, Ge(-MAX_INT), Le(MAX_INT)]], BeforeValidator(_number(integer=True))]
Flag = Annotated[Optional[bool], BeforeValidator(_typed(bool, "true or false"))]
Text = Annotated[Optional[str], BeforeValidator(_typed(str, "a string"))]
Reasons = Annotated[Optional[Dict[str, Text]], BeforeValidator(_obj)]

#: Times and sizes: ms, s, MB, percentages, rates. Counts: iterations, samples, runs.
Ms = Seconds = MB = Pct = Rate = NonNegative


class Section(BaseModel):
    """Fields this version does not know are kept as they are, for a newer writer's file."""

    model_config = ConfigDict(extra="allow", strict=False, validate_default=False)


def Obj(model: type) -> Any:
    """An optional nested object: null, absent, or the model (never a list or a number)."""
    return Annotated[Optional[model], BeforeValidator(_obj)]


def Map(item: Any) -> Any:
    """An object whose keys are names (metrics, phases, sections) and whose values are all of one type."""
    return Annotated[Optional[Dict[str, item]], BeforeValidator(_obj)]


def Seq(item: Any) -> Any:
    return Annotated[Optional[List[item]], BeforeValidator(_seq)]


class RankSpread(Section):
    """One figure across the ranks of a DDP run (``spread_across_ranks``)."""

    per_rank: Seq(NonNegative) = Field(None, description="the figure of each rank, rank 0 first; null where a rank had"
                                                         " none")
    min: NonNegative = None
    median: NonNegative = None
    max: NonNegative = None
    worst_rank: Count = Field(None, description="the rank with the highest figure")


#: Per-rank figures under DDP: documented in each callback's page, read by no reader of the file.
Ranks = Annotated[Map(Obj(RankSpread)), Field(description="under DDP: figure -> its spread across the ranks")]

#: What a callback's section holds instead of its figures when building them raised.
SectionError = Annotated[Text, Field(description="the section could not be built: the exception, `Type: message`")]


# -- run, error, logged ----------------------------------------------------------------------------------------------

class Versions(Section):
    python: Text = None
    torch: Text = None
    lightning: Text = None
    lightning_perf: Text = None
    cuda: Text = None


class Run(Section):
    started_at: Text = Field(None, description="ISO 8601 UTC, the fit's setup")
    finished_at: Text = None
    host: Text = None
    platform: Text = None
    command: Text = None
    versions: Obj(Versions) = None
    device: Text = Field(None, description="GPU name on CUDA, else `cpu: <processor>`")
    accelerator: Text = None
    precision: Text = None
    strategy: Text = None
    world_size: Count = None
    num_nodes: Count = None
    accumulate_grad_batches: Count = None
    cpu_count: Count = Field(None, description="logical CPUs this process may run on")
    memory_total_mb: MB = Field(None, description="the host's physical memory")
    model_class: Text = Field(None, description="the LightningModule's class, `module.QualName`")
    num_workers: Count = Field(None, description="the training data loader's worker processes")
    max_steps: Integer = Field(None, description="-1 when unlimited")
    max_epochs: Integer = Field(None, description="-1 when unlimited")
    global_step: Count = None
    epochs_completed: Count = None
    log_dir: Text = None
    name: Text = Field(None, description="`run_name`, shown by compare and report")
    notes: Text = Field(None, description="`run_notes`, report's Notes column")


class Error(Section):
    type: Text = None
    message: Text = None
    signal: Text = Field(None, description="`SIGINT` or `SIGTERM` for an interrupted fit")


class Logged(Section):
    values: Map(Real) = Field(None, description="name -> last logged value; report's loss columns and `--column`")
    monitor: Text = Field(None, description="what `ModelCheckpoint(monitor=...)` watched")


# -- iteration_timer ---------------------------------------------------------------------------------------------------

class IterStats(Section):
    mean: Ms = None
    median: Ms = None
    min: Ms = None
    max: Ms = None
    p50: Ms = None
    p95: Ms = None
    p99: Ms = None
    std: Ms = None


class Epoch(Section):
    epoch: Count = None
    time_s: Seconds = None
    iterations: Count = None
    it_per_s: Rate = None
    eval_time_s: Seconds = None


class Histogram(Section):
    relative_accuracy: Rate = None
    count: Count = None
    sum: Ms = None
    min: Ms = None
    max: Ms = None
    mean: Ms = None
    m2: NonNegative = None
    zero_count: Count = None
    bin_keys: Seq(Annotated[int, Ge(-MAX_INT), Le(MAX_INT), BeforeValidator(_number(integer=True, null=False))]) = None
    bin_counts: Seq(Annotated[int, Ge(0), Le(MAX_INT), BeforeValidator(_number(integer=True, ge=0, null=False))]) = None


class Blocks(Section):
    block_len: Positive = Field(None, description="iterations per stored block")
    sums: Seq(Annotated[FiniteFloat, Ge(0), BeforeValidator(_number(ge=0, null=False))]) = None
    open_sum: Ms = None
    open_count: Count = Field(None, description="iterations in the partly filled last block, at most `block_len`")
    max_blocks: Positive = None


class _HowOften(Section):
    median_ms: Ms = Field(None, description="its median per iteration over the run (0 for one that runs in half the"
                                            " iterations or fewer)")
    runs_in: Count = Field(None, description="the measured iterations it ran in (this process)")
    of_iterations: Count = Field(None, description="of this many measured iterations")


class OverMedian(_HowOften):
    section: Text = Field(None, description="the section of the iteration that exceeded its median the most")
    ms: Ms = Field(None, description="its time in that iteration")
    excess_ms: Ms = None


class CauseSection(_HowOften):
    name: Text = Field(None, description="of this cause's kept slow iterations with a SectionProfiler record, the"
                                         " section that exceeded its median by the most time in all")
    iterations: Count = Field(None, description="how many of them name it")
    of_kept: Count = Field(None, description="of this cause's kept slow iterations that SectionProfiler recorded")
    mean_ms: Ms = Field(None, description="its mean time in them")


class TailCause(Section):
    iterations: Count = Field(None, description="iterations above the threshold put down to this cause")
    time_s: Seconds = Field(None, description="their whole time")
    excess_s: Seconds = Field(None, description="their time above the median iteration")
    mean_ms: Ms = None
    share_pct: Pct = Field(None, description="their time, % of training time")
    flagged_iterations: Count = Field(None, description="all measured iterations put down to this cause (their first"
                                                        " cause), slow or not")
    also: Map(Count) = Field(None, description="other cause -> how many of the `flagged_iterations` it coincided with")
    gc_pause_s: Seconds = Field(None, description="for `gc`: the flagged collections' pauses in the"
                                                  " `flagged_iterations`")
    own_s: Seconds = Field(None, description="for `lightning_perf`: the time its own periodic work took in the"
                                             " `flagged_iterations`")
    section: Obj(CauseSection) = Field(None, description="with SectionProfiler in the run: the section that grew")


class TraceLink(Section):
    path: Text = Field(None, description="StepTrace's Chrome/Perfetto trace file")
    first_step: Count = None
    last_step: Count = None
    covers: Text = Field(None, description="`this` (the trace holds this iteration) or `next` (the steps right after it)")


class TailIteration(Section):
    step: Count = Field(None, description="global step at its end")
    iteration: Count = Field(None, description="the run's iteration number")
    epoch: Count = None
    ms: Ms = None
    causes: Seq(Text) = None
    gc_pause_ms: Ms = None
    section: Obj(OverMedian) = Field(None, description="with SectionProfiler in the run: the section that exceeded"
                                                       " its median the most in this iteration")
    trace: Obj(TraceLink) = Field(None, description="with StepTrace in the run: a trace of this iteration or of the"
                                                   " steps after it")


class TailGc(Section):
    collections: Count = Field(None, description="Python garbage collections while training, all generations")
    full_collections: Count = Field(None, description="of them, full (generation 2) collections")
    pause_s: Seconds = Field(None, description="their pauses, in all")


class TailDataLoader(Section):
    num_workers: Count = Field(None, description="the training DataLoader's worker processes")
    persistent_workers: Flag = Field(None, description="whether they stay alive across epochs")


class Tail(Section):
    share_pct: Pct = Field(None, description="% of training time in iterations over `factor` x the median")
    iterations: Count = None
    time_s: Seconds = None
    median_ms: Ms = None
    threshold_ms: Ms = None
    factor: NonNegative = None
    by_cause: Map(Obj(TailCause)) = Field(None, description="`epoch_start`, `checkpoint`, `after_validation`,"
                                                           " `alloc_retry`, `gc`, `lightning_perf`, `unexplained`")
    slowest: Seq(Obj(TailIteration)) = Field(None, description="the `keep_slowest` slowest, slowest first")
    keep_slowest: Count = Field(None, description="IterationTimer's `keep_slowest`")
    gc: Obj(TailGc) = None
    alloc_retries: Count = Field(None, description="the CUDA allocator's retries in training (null off CUDA)")
    dataloader: Obj(TailDataLoader) = Field(None, description="null when the loader's workers could not be read")
    insights: Seq(Text) = None


class IterationTimer(Section):
    iterations: Count = None
    batches: Count = None
    samples: Count = None
    measured_iterations: Count = None
    warmup_steps: Count = None
    excluded: Map(Count) = Field(None, description="reason -> iterations left out, e.g. `warmup`")
    warmup_time_s: Seconds = None
    startup_time_s: Seconds = Field(None, description="all fits: from IterationTimer's `setup` to the training loop's"
                                                      " start (model setup, `configure_model`, the sanity check)")
    fits: Count = None
    manual_optimization: Flag = None
    resumed_at_iteration: Count = None
    ms_per_iter: Obj(IterStats) = Field(None, description="host clock; `mean` is the headline: it/s = 1000 / mean")
    it_per_s: Rate = None
    batches_per_s: Rate = None
    samples_per_s: Rate = None
    items: Count = Field(None, description="items (tokens, pixels) per batch, from `items_fn`")
    items_per_s: Rate = None
    flops_per_batch: NonNegative = Field(None, description="FLOPs of one training batch, forward and backward")
    flops_source: Text = Field(None, description="`argument` or `auto`")
    flops_count_time_s: Seconds = Field(None, description="`auto`: the time the FLOP count took (outside the"
                                                          " measured iterations)")
    tflops_per_s: Rate = Field(None, description="per device, over the measured iterations")
    available_flops: NonNegative = Field(None, description="the device's peak FLOP/s for `flops_dtype`")
    available_flops_source: Text = Field(None, description="`argument` or `get_available_flops` (Lightning's table)")
    flops_dtype: Text = Field(None, description="the dtype the peak is read for, e.g. `bfloat16`")
    mfu_pct: Pct = Field(None, description="model FLOPs utilisation: achieved / available FLOP/s, in %")
    tail: Obj(Tail) = None
    device_ms_per_iter: Obj(IterStats) = Field(None, description="CUDA events, over the iterations timed on the"
                                                              " device (`device_timed_iterations`)")
    device_events_dropped: Count = None
    device_timed_iterations: Count = Field(None, description="the intervals `device_ms_per_iter` holds: the"
                                                             " iterations timed on the device, less any that a"
                                                             " validation interrupted or a dropped event broke")
    device_timing_every_n_iterations: Positive = None
    train_time_s: Seconds = None
    eval_time_s: Seconds = None
    sanity_check_time_s: Seconds = None
    validation_runs: Count = None
    eval_time_per_validation_s: Seconds = None
    epochs: Seq(Epoch) = None
    target_steps: Count = None
    projected_time_to_target_s: Seconds = None
    projected_time_to_target_with_eval_s: Seconds = None
    projected_remaining_s: Seconds = None
    projected_remaining_with_eval_s: Seconds = None
    histogram_ms: Obj(Histogram) = None
    blocks_ms: Obj(Blocks) = Field(None, description="what compare cuts into batches for its interval")
    ranks: Ranks = None
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None


# -- vram ---------------------------------------------------------------------------------------------------------------

class PhaseMemory(Section):
    peak_allocated_mb: MB = None
    peak_reserved_mb: MB = None
    nvml_peak_used_mb: MB = None
    nvml_process_peak_mb: MB = None
    host_rss_peak_mb: MB = None
    usage_pct: Pct = None
    headroom_pct: Real = Field(None, description="schema 1")
    alloc_retries: Count = Field(None, description="CUDA allocator retries in the phase (its cache freed and the"
                                                   " allocation tried again: a stall each)")
    ooms: Count = Field(None, description="out-of-memory errors the allocator raised in the phase")
    fragmentation_mb: MB = Field(None, description="reserved minus allocated at the phase's end")
    fragmentation_pct: Pct = Field(None, description="the same, % of reserved")
    largest_free_block_mb: MB = Field(None, description="the largest cached block no tensor held at the phase's end")


class Leak(Section):
    suspected: Flag = Field(None, description="growth that continues: the floor of the phase's later half rises")
    rate_mb_per_100_iters: Real = Field(None, description="the slope of that floor; negative when memory shrinks")
    growth_stopped: Flag = Field(None, description="memory rose enough to warn while the phase ran, then stopped"
                                                   " rising: no leak")
    samples: Count = None
    iterations_per_sample: Count = None


class Reading(Section):
    mean: NonNegative = None
    p5: NonNegative = Field(None, description="5th percentile: 5% of the samples were at or below it")
    samples: Count = None


class ShareReading(Reading):
    """A reading of a share of time, samples or cores: 0 to 100, as the sampler clamps it."""

    mean: Share = None
    p5: Share = Field(None, description="5th percentile: 5% of the samples were at or below it")


class PhaseActivity(Section):
    gpu_util_pct: Obj(ShareReading) = Field(None, description="NVML: % of time a kernel was running")
    mem_util_pct: Obj(ShareReading) = Field(None, description="NVML: % of time device memory was read or written")
    power_w: Obj(Reading) = None
    sm_clock_mhz: Obj(Reading) = None
    temperature_c: Obj(Reading) = None
    process_cpu_cores: Obj(Reading) = Field(None, description="psutil: cores this process kept busy")
    host_cpu_pct: Obj(ShareReading) = Field(None, description="psutil: % of all logical cores busy")
    host_steal_pct: Obj(ShareReading) = Field(None, description="psutil: % of the machine's CPU time a hypervisor"
                                              " gave to other machines (Linux)")
    cpu_wait_pct: Obj(ShareReading) = Field(None, description="schedstat: % of wall time the training thread was"
                                            " ready to run but waited for a CPU")
    gpu_throttled_pct: Obj(ShareReading) = Field(None, description="NVML: % of samples in which the board slowed"
                                                 " its clocks for power or heat")


class PhaseEnergy(Section):
    energy_j: NonNegative = Field(None, description="the device's energy over the phase, J (null under `min_span_s`)")
    seconds: Seconds = Field(None, description="the span its readings cover")
    mean_power_w: NonNegative = Field(None, description="`energy_j` / `seconds`")
    iterations: Count = Field(None, description="train: IterationTimer's iterations over the same batches")
    samples: Count = Field(None, description="train: IterationTimer's samples over the same batches")
    j_per_iteration: NonNegative = None
    j_per_sample: NonNegative = None
    samples_per_j: Rate = None
    unavailable: Reasons = None


class Energy(Section):
    source: Text = Field(None, description="`energy counter` (NVML's, mJ) or `power x time` (NVML power integrated)")
    min_span_s: Seconds = Field(None, description="a phase's figure needs readings spanning at least this long")
    readings: Count = None
    train_batches: Count = Field(None, description="training batches seen, matched to IterationTimer's `batches`")
    phases: Map(Obj(PhaseEnergy)) = Field(None, description="`train`, `validation`, ... (docs/energy.md)")
    unavailable: Reasons = Field(None, description="`counter`: why power x time; `energy`: why no figure")


class Activity(Section):
    source: Text = Field(None, description="`NVML + psutil`, `psutil` or `NVML`")
    interval_s: Seconds = None
    host_min_span_s: Seconds = None
    host_logical_cores: Count = None
    ticks: Count = None
    phases: Map(Obj(PhaseActivity)) = Field(None, description="`train`, `validation`, `test`, `predict`")
    unavailable: Reasons = None
    energy: Obj(Energy) = Field(None, description="the device's energy per phase; null (`unavailable.energy`) without"
                                                  " NVML")


class Vram(Section):
    device: Text = None
    source: Text = None
    device_total_mb: MB = None
    phases: Map(Obj(PhaseMemory)) = Field(None, description="`train`, `validation`, `test`, `predict`, and"
                                          " `eval_in_train_hooks` (evaluation a training hook runs inside"
                                          " `lightning_perf.phase`)")
    lifetime_peak_allocated_mb: MB = None
    lifetime_peak_reserved_mb: MB = None
    resets_torch_peak_stats: Flag = None
    host_rss_method: Text = Field(None, description="on host RSS, how each phase gets its own peak (null on CUDA)")
    warn_above_pct: Pct = None
    leak: Map(Obj(Leak)) = None
    leak_suspected: Flag = None
    leak_threshold_mb_per_100_iters: Rate = None
    nvml_interval_s: Seconds = None
    sampler_samples: Count = None
    ranks: Ranks = None
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None
    activity: Obj(Activity) = Field(None, description="what the GPU and host were doing, per phase")


# -- step_trace ---------------------------------------------------------------------------------------------------------

class TraceOp(Section):
    name: Text = Field(None, description="an op, or a `record_function` range")
    calls: Count = None
    self_cpu_ms: Ms = Field(None, description="host time in the op itself")
    total_cpu_ms: Ms = Field(None, description="host time with what ran inside it")
    self_device_ms: Ms = Field(None, description="device time of its kernels (null without CUDA)")


class TraceCapture(Section):
    path: Text = Field(None, description="the Chrome/Perfetto JSON trace (null where it could not be written)")
    first_step: Count = None
    last_step: Count = None
    complete: Flag = Field(None, description="false where the run ended or failed inside the window, or the trace"
                                             " could not be written")
    write_error: Text = Field(None, description="why the trace could not be written (a full disk, a file-size"
                                                " limit: the file was missing or cut short, and is removed)")
    trigger: Text = Field(None, description="`requested` (`steps`) or `slow` (after an iteration over `slow_factor`"
                                            " x the median)")
    slow_step: Count = Field(None, description="for `slow`: the slow iteration's step")
    slow_ms: Ms = None
    median_ms: Ms = Field(None, description="the median iteration when it was judged")
    captured_ms: Ms = Field(None, description="wall time from the profiler's start to its stop")
    start_ms: Ms = Field(None, description="what starting the profiler cost")
    write_ms: Ms = Field(None, description="what stopping it and writing the trace cost")
    top_ops: Seq(Obj(TraceOp)) = Field(None, description="the ops with the most self time (device where recorded)")


class StepTrace(Section):
    activities: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(None, description="`cpu`, `cuda`")
    steps: Seq(Count) = Field(None, description="the steps asked for")
    slow_factor: NonNegative = None
    capture_steps: Count = None
    max_captures: Count = None
    warmup_steps: Count = None
    trace_dir: Text = None
    median_ms: Ms = Field(None, description="median of the last 64 iterations StepTrace judged (host, batch end to"
                                            " batch end); null without `slow_factor`")
    slow_iterations: Count = Field(None, description="iterations judged over `slow_factor` x the median while"
                                                     " captures were left (null without `slow_factor`)")
    captures: Seq(Obj(TraceCapture)) = None
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None


# -- memory_snapshot ----------------------------------------------------------------------------------------------------

class SnapshotAllocation(Section):
    size_mb: MB = Field(None, description="what was asked for")
    block_mb: MB = Field(None, description="the allocator's block for it (rounded up)")
    device_free_mb: MB = Field(None, description="for a failed request: the device's free memory then")
    frame: Text = Field(None, description="the innermost frame outside torch, Lightning and lightning_perf: your line")
    frames: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(None, description="innermost first")


class Snapshot(Section):
    trigger: Text = Field(None, description="`oom` or `steps`")
    stage: Text = None
    phase: Text = Field(None, description="what ran: `train`, `validate`, `sanity_check`, `test` or `predict`")
    step: Count = Field(None, description="in training, the iteration that failed (the step at its end, as in the"
                                          " tail); else the global step when it was dumped")
    path: Text = Field(None, description="the pickle (https://pytorch.org/memory_viz)")
    html: Map(Text) = Field(None, description="view (`trace_plot`, `segment_plot`) -> HTML file")
    allocated_mb: MB = None
    reserved_mb: MB = None
    trace_entries: Count = Field(None, description="allocator events in the history")
    history_full: Flag = Field(None, description="the history reached `max_entries`: its oldest events dropped out")
    top_allocations: Seq(Obj(SnapshotAllocation)) = Field(None, description="largest live allocations, largest first")
    failed_request: Obj(SnapshotAllocation) = Field(None, description="the allocation that ran out of memory")
    dump_ms: Ms = None
    unavailable: Reasons = None


class MemorySnapshot(Section):
    on_oom: Flag = None
    steps: Seq(Count) = Field(None, description="`[first, last]` of the recorded window")
    max_entries: Count = None
    stacks: Text = None
    recorded: Flag = Field(None, description="whether the allocator's history was recorded in this run")
    snapshot_dir: Text = None
    snapshots: Seq(Obj(Snapshot)) = None
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None


# -- quality_gate, section_profiler, eval_no_grad_guard -----------------------------------------------------------------

class Metric(Section):
    value: Real = None
    mode: Annotated[Optional[Literal["max", "min"]], BeforeValidator(_typed(str, "a string"))] = Field(
        None, description="`max`: higher is better; `min`: lower is better")
    passed: Flag = None
    reason: Text = None
    step: Count = Field(None, description="the global step of the check that gave this verdict")
    baseline: Real = Field(None, description="the baseline's value, with a baseline")
    delta: Real = Field(None, description="`value` - `baseline`")
    delta_pct: Real = Field(None, description="`delta`, % of the baseline's magnitude (null for a baseline of 0)")
    tolerance: NonNegative = None
    tolerance_mode: Annotated[Optional[Literal["relative", "absolute"]], BeforeValidator(_typed(str, "a string"))] = (
        Field(None, description="`relative`: `tolerance` is a fraction of the baseline; `absolute`: in the metric's"
                                " units"))
    allowed_delta: NonNegative = Field(None, description="how far `value` may move the bad way and pass")


class FailedCheck(Section):
    step: Count = None
    metrics: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(None, description="the metrics that failed it")
    reason: Text = Field(None, description="with `require_same_step`: why the step was not the baseline's")


class Lpips(Section):
    net: Text = Field(None, description="`alex`, `vgg` or `squeeze`")
    available: Flag = None
    backbone: Text = Field(None, description="`pretrained`, or `random (plumbing only, not LPIPS)`")


class QualityGate(Section):
    passed: Flag = Field(None, description="null when nothing was gated")
    reason: Text = Field(None, description="with a baseline and no check run: why the gate did not pass")
    last_check_passed: Flag = None
    action: Text = None
    metrics: Map(Obj(Metric)) = None
    checks: Count = None
    failed_checks: Seq(Obj(FailedCheck)) = Field(None, description="the first failed checks (at most 100)")
    failed_check_count: Count = None
    step: Count = None
    images_scored: Count = None
    baseline_images: Count = None
    baseline_step: Count = Field(None, description="the global step the baseline was recorded at, where it says")
    require_same_step: Flag = Field(None, description="a check at another step than `baseline_step` fails")
    baseline_source: Text = None
    baseline: Map(Real) = Field(None, description="metric -> the baseline value it is gated against")
    recorded_baseline: Text = None
    data_range: Real = None
    lpips: Obj(Lpips) = Field(None, description="with `lpips` among the metrics: the network it was scored with")
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None


class Section_(Section):
    kind: Text = Field(None, description="`auto`, `user` (a profile_section) or `optimizer` (under manual"
                                         " optimization with several optimizers, one optimizer's share of"
                                         " `optimizer_step`: inside it, not beside it)")
    parent: Text = None
    count: Count = None
    total_s: Seconds = None
    mean_ms: Ms = None
    min_ms: Ms = None
    max_ms: Ms = None
    p50_ms: Ms = None
    p95_ms: Ms = None
    share_pct: Pct = None
    inclusive_total_s: Seconds = Field(None, description="automatic sections: with the user sections inside them")
    inclusive_mean_ms: Ms = Field(None, description="automatic sections: with the user sections inside them")
    inclusive_share_pct: Pct = Field(None, description="automatic sections: with the user sections inside them")
    device_mean_ms: Ms = None
    closed_by_exception: Count = None


class Validation(Section):
    runs: Count = None
    total_s: Seconds = None


class FinalSection(Section):
    kind: Text = None
    parent: Text = None
    count: Count = Field(None, description="calls (checkpoint writes and removals, user section calls); 1 for other")
    total_s: Seconds = None
    closed_by_exception: Count = None


class AfterLastIteration(Section):
    total_s: Seconds = Field(None, description="from the last iteration's close to on_fit_end, validation left out")
    sections: Map(Obj(FinalSection)) = None


class SlowIteration(Section):
    iteration: Count = Field(None, description="the run's iteration number as SectionProfiler counts it")
    step: Count = Field(None, description="the global step at its end, what IterationTimer's `tail.slowest` is joined"
                                          " by (null under manual optimization: joined by iteration number)")
    ms: Ms = None
    sections_ms: Map(Ms) = Field(None, description="section -> ms in this iteration")
    over_median: Obj(OverMedian) = None


class LoaderWorkers(Section):
    num_workers: Count = Field(None, description="the training DataLoaders' workers")
    batches: Count = Field(None, description="batches the workers made while training ran (timed inside them)")
    busy_ms_per_batch: Ms = Field(None, description="a worker's fetch and collate time per batch, mean")
    busy_pct: Pct = Field(None, description="making the batches of an iteration, % of the workers' time at the loop's"
                                            " pace (100 or more: saturated)")
    cpu_pct: Pct = Field(None, description="the workers' CPU time in their fetch and collate (the fetching thread's),"
                                           " % of that time (near 100: computing; near 0: waiting on sleep or I/O)")
    core_wait_pct: Pct = Field(None, description="the fetching thread's time ready to run but waiting for a core, %"
                                                 " of the fetch and collate time (Linux's schedstat; null elsewhere)")
    cpu_count: Count = Field(None, description="the cores this process may run on")


class SectionProfiler(Section):
    enabled: Flag = None
    data_loading_boundary: Text = Field(None, description="`fetch` or `batch_gap`: where data loading was timed")
    workers: Obj(LoaderWorkers) = Field(
        None, description="what the DataLoader's workers spent per batch, beside the loop's wait (`data_loading`)")
    manual_optimization: Flag = None
    warmup_steps: Count = None
    device_timing_every_n_iterations: Positive = None
    report_every_n_steps: Positive = None
    iterations: Count = None
    iteration_ms: Obj(IterStats) = None
    sections: Map(Obj(Section_)) = None
    slowest_section: Text = None
    validation: Obj(Validation) = Field(None, description="validations inside fit, timed outside the table")
    after_last_iteration: Obj(AfterLastIteration) = Field(
        None, description="the fit's work after its last iteration (last checkpoint, on_train_end), outside the table")
    slowest_iterations: Seq(Obj(SlowIteration)) = Field(
        None, description="this process's slowest iterations (up to 20), slowest first")
    insights: Seq(Annotated[str, BeforeValidator(_text_item)]) = None
    overhead_us_per_step: Real = None
    thresholds: Map(Real) = Field(None, description="the insights' thresholds, name -> value")
    ranks: Ranks = None
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None


class GradFinding(Section):
    site: Text = Field(None, description="the hook that ran the forward, `Class.method`")
    hook: Text = Field(None, description="the Lightning hook on the stack, null when none was")
    module: Text = Field(None, description="the module's class")
    count: Count = Field(None, description="forwards with autograd on: in eval mode, or of the LightningModule's"
                                           " modules between training steps")
    saved_for_backward_mb: MB = None
    fixed: Flag = Field(None, description="`mode='fix'` ran them under `torch.no_grad()`")
    training_mode: Flag = Field(None, description="the module was in training mode: a forward of the"
                                                  " LightningModule's modules between training steps")


class RetainedGraph(Section):
    attribute: Text = Field(None, description="the module's attribute that held them")
    seen_at: Text = Field(None, description="the hook where it was first seen")
    max_count: Count = Field(None, description="the most tensors with autograd graphs it held at once")
    max_mb_kept: MB = Field(None, description="the most memory they kept alive")
    epochs_seen: Count = Field(None, description="the epoch ends (training or validation) it was found at")


#: The phase of a training-mode finding a training hook ran without `phase("eval_in_train_hooks")` around it.
TRAIN_HOOKS = "train_hooks"


class TrainModeFinding(Section):
    phase: Text = Field(None, description="`validation`, `test`, `predict`, `eval_in_train_hooks` or `train_hooks`"
                                          " (a training hook's forward of the LightningModule's modules, unmarked)")
    site: Text = Field(None, description="the hook that opened `eval_in_train_hooks` or ran the `train_hooks`"
                                         " forward; null for Lightning's loops")
    runs: Count = Field(None, description="evaluation runs of this phase and site that ran modules in training mode"
                                          " (0 for `train_hooks`: its forwards are counted)")
    forwards: Count = Field(None, description="training-mode forwards of the module that had most, summed over runs;"
                                               " null where none could be counted")
    modules: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(
        None, description="qualified names of the modules found, the first 16")
    module_types: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(None, description="their classes")
    module_count: Count = Field(None, description="modules found in training mode in one run, at most")
    running_stats_changed: Flag = Field(None, description="a BatchNorm's `num_batches_tracked` moved")
    uncounted: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(
        None, description="modules seen in training mode inside a `torch.compile`'d module, forwards not counted")


class EvalNoGradGuard(Section):
    mode: Text = None
    allow: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(None, description="the hooks allowed grad in eval")
    clean: Flag = Field(None, description="no finding of any kind; null when a check failed and found nothing")
    grad_enabled_eval_forwards: Count = None
    saved_for_backward_mb: MB = None
    findings: Seq(Obj(GradFinding)) = Field(None, description="one per (site, module)")
    retained_graphs: Seq(Obj(RetainedGraph)) = Field(None, description="one per module attribute")
    check_train_mode: Flag = None
    train_mode_eval_forwards: Count = Field(None, description="evaluation forwards with modules in training mode")
    train_mode_findings: Seq(Obj(TrainModeFinding)) = Field(None, description="one per (phase, site)")
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None


class Ceiling(Section):
    at_most: NonNegative = Field(None, description="x faster at most, by Amdahl's law on the measured share")
    assumption: Text = Field(None, description="what is assumed removed, and of what time")


class Straggler(Section):
    rank: Count = Field(None, description="the rank the others wait for")
    section: Text = Field(None, description="its automatic section furthest above the other ranks' median")
    ms: Ms = Field(None, description="its mean ms of that section")
    others_median_ms: Ms = Field(None, description="the other ranks' median of their means of that section")
    ratio: NonNegative = Field(None, description="`ms` / `others_median_ms`; null where that median is 0")
    excess_ms: Real = Field(None, description="`ms` - `others_median_ms`")
    lag_ms: Real = Field(None, description="its own time in an iteration (every section but `backward`, where the"
                                           " ranks meet) beyond the other ranks' median: how long they wait for it")
    lag_pct: Real = Field(None, description="`lag_ms`, % of iteration time (>= 15: docs/diagnosis.md#stragglers)")
    others_wait_ms: Real = Field(None, description="the other ranks' median `backward` less its own: their wait at"
                                                   " the gradient all-reduce; null where not measured")
    ranks: Positive = Field(None, description="the ranks compared (the world size)")
    line: Text = Field(None, description="the words the diagnosis line, compare and report print")


class Diagnosis(Section):
    verdict: Text = Field(None, description="`input-bound`, `host-bound`, `compute-bound`, `evaluation-heavy`,"
                                            " `checkpoint-heavy`, `tail-heavy`, `mixed` or `not-enough-measured`")
    figure: Text = Field(None, description="the measured figure that decided it")
    value: Pct = Field(None, description="its value, %")
    of: Text = Field(None, description="what the % is of, e.g. `iteration time`")
    threshold: Pct = Field(None, description="the threshold it crossed, % (docs/diagnosis.md)")
    advice: Text = Field(None, description="the one change most likely to help")
    also: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(None, description="other verdicts that fired")
    unchecked: Reasons = Field(None, description="verdict -> why it could not be checked")
    reason: Text = Field(None, description="why no verdict (`not-enough-measured`)")
    thresholds: Map(Real) = None
    contention: Text = Field(None, description="`the machine was busy: ...` where the run was measured under"
                                               " contention (docs/diagnosis.md), else null")
    ceilings: Map(Obj(Ceiling)) = Field(None, description="verdict -> what removing that bottleneck could give at"
                                                          " most (docs/diagnosis.md#ceilings)")
    evidence: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(None, description="where to look next: a"
                                                                        " trace, a memory snapshot, allocator pressure")
    straggler: Obj(Straggler) = Field(None, description="under DDP, the rank the others wait for and its section"
                                                        " (docs/diagnosis.md#stragglers); null on one device or when"
                                                        " no rank is that far out")


class TrialArm(Section):
    iterations: Count = Field(None, description="counted iterations of this arm")
    ms_per_iter: Ms = None
    it_per_s: Rate = None
    samples_per_s: Rate = None


class TrialMetric(Section):
    off: Real = None
    on: Real = None
    change_pct: Real = Field(None, description="(on - off) / |off|, %")
    tolerance_pct: Pct = Field(None, description="the QualityGate's tolerance (relative), else 0.5")
    direction: Text = Field(None, description="`max` or `min`: which way is better; null when not known")
    degraded: Flag = Field(None, description="outside the tolerance in the bad direction (either, when not known)")


class TrialQuality(Section):
    batches: Count = Field(None, description="validation batches scored under each arm")
    source: Text = Field(None, description="`quality_gate` (its image metrics and what validation_step logs) or"
                                           " `logged`")
    metrics: Map(Obj(TrialMetric)) = None


class Trial(Section):
    change: Text = Field(None, description="the change tried (docs/trials.md)")
    targets: Text = Field(None, description="the diagnosis verdict it targets, for the ceiling beside its gain")
    status: Text = Field(None, description="`done`, `incomplete` (the fit ended first), `stopped` (see `reason`),"
                                           " `not-started`")
    reason: Text = None
    warmup: Count = None
    block: Count = None
    blocks_planned: Count = None
    order: Text = Field(None, description="`random` or `abba`")
    settle: Count = None
    seed: Integer = None
    confidence: Real = None
    arms: Map(Obj(TrialArm)) = Field(None, description="`off` and `on`")
    pairs: Count = Field(None, description="complete pairs of blocks measured")
    blocks: Count = Field(None, description="blocks in those pairs")
    pair_off_ms: Seq(Ms) = Field(None, description="each complete pair's mean ms an iteration with the change off, in"
                                                   " block order (`lightning-perf matrix` pools them over repeats)")
    pair_on_ms: Seq(Ms) = Field(None, description="the same pairs' mean ms an iteration with the change on")
    time_ratio: NonNegative = Field(None, description="mean time on / mean time off")
    speedup: NonNegative = Field(None, description="mean time off / mean time on: above 1, the change is faster")
    speedup_low: NonNegative = None
    speedup_high: NonNegative = None
    verdict: Text = Field(None, description="`faster`, `slower` or `within-noise` (the interval holds 1)")
    switches: Count = None
    switch_ms_mean: Ms = Field(None, description="a switch's time, left out of both arms")
    switch_s_total: Seconds = None
    quality: Obj(TrialQuality) = Field(None, description="validation metrics under each arm, on the same batches")
    quality_degraded_on: Seq(Annotated[str, BeforeValidator(_text_item)]) = Field(
        None, description="metrics outside the tolerance with the change on")
    line: Text = Field(None, description="the line printed at the trial's end")
    unavailable: Reasons = None
    measurement_failures: Reasons = None
    error: SectionError = None


class PerfSummary(Section):
    """One perf_summary.json. ``schema_version``, ``status`` and ``run`` are required; every section is optional."""

    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSION)] = Field(
        description=f"1 or {SCHEMA_VERSION}; a reader refuses versions it does not know")
    status: Literal[STATUSES] = Field(description="`running` only while a fit is still writing")  # type: ignore
    stage: Text = Field(None, description="`fit`, `validate`, `test` or `predict`")
    error: Obj(Error) = None
    diagnosis: Obj(Diagnosis) = Field(None, description="the run's one primary diagnosis (fit records)")
    run: Annotated[Run, BeforeValidator(_obj)]
    logged: Obj(Logged) = None
    iteration_timer: Obj(IterationTimer) = None
    section_profiler: Obj(SectionProfiler) = None
    vram: Obj(Vram) = None
    quality_gate: Obj(QualityGate) = None
    eval_no_grad_guard: Obj(EvalNoGradGuard) = None
    trial: Obj(Trial) = Field(None, description="ABTrial: a change tried in alternating blocks (docs/trials.md)")
    step_trace: Obj(StepTrace) = None
    memory_snapshot: Obj(MemorySnapshot) = None


# -- reading -------------------------------------------------------------------------------------------------------------

def _path(loc: Tuple[Union[str, int], ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top level>"


def _reason(error: Dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "summary_field":
        return error["ctx"]["reason"]
    if kind == "missing":
        return "is required"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be an object, got {show(error.get('input'))}"
    if kind == "literal_error":
        return f"must be one of {error['ctx']['expected']}, got {show(error.get('input'))}"
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}, got {show(error.get('input'))}"


def _first_problem(data: Dict[str, Any]) -> Optional[str]:
    """Checks that have better words than a type error: what the file is, which versions this reader knows."""
    version = data.get("schema_version")
    if version is None:
        return "no `schema_version`; this is not a lightning_perf summary"
    if isinstance(version, bool) or not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        return (f"unsupported schema_version {show(version)}; this lightning_perf reads versions"
                f" 1..{SCHEMA_VERSION}")
    status = data.get("status")
    if status not in STATUSES:
        return f"unknown status {show(status)}; expected one of {', '.join(STATUSES)}"
    return None


def _check_blocks(summary: PerfSummary) -> Optional[str]:
    blocks = summary.iteration_timer.blocks_ms if summary.iteration_timer else None
    if blocks is None or blocks.block_len is None or blocks.open_count is None:
        return None
    if blocks.open_count > blocks.block_len:
        return (f"`iteration_timer.blocks_ms.open_count` must be at most block_len ({blocks.block_len}),"
                f" got {blocks.open_count}")
    return None


def parse(data: Any, source: str = "<summary>") -> PerfSummary:
    """The typed summary of ``data`` (a decoded JSON document); raises :class:`SummaryError` with one line naming
    ``source``, the field's path, the bad value and what is allowed."""
    if isinstance(data, PerfSummary):
        return data
    if not isinstance(data, Mapping):
        raise SummaryError(f"{source}: expected a JSON object at the top level, got {show(data)}")
    problem = _first_problem(data)
    if problem:
        raise SummaryError(f"{source}: {problem}")
    try:
        summary = PerfSummary.model_validate(dict(data))
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        raise SummaryError(f"{source}: `{_path(first['loc'])}` {_reason(first)}") from None
    except RecursionError:
        raise SummaryError(f"{source}: nested too deeply to read") from None
    problem = _check_blocks(summary)
    if problem:
        raise SummaryError(f"{source}: {problem}")
    return summary


def validate(data: Any, source: str = "<summary>") -> Dict[str, Any]:
    """Checks a decoded summary against the typed model and returns it; raises :class:`SummaryError` with one line
    naming ``source``, the field, the bad value and what is allowed."""
    parse(data, source)
    return data


def as_summary(data: Any, source: str = "<summary>") -> PerfSummary:
    """What every reader calls first: a typed summary, from a typed summary or a decoded dict."""
    return parse(data, source)
