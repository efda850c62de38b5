"""Measuring: latency and throughput of an optimized model against its baseline (``onnxfuse bench``), of one
FusedLinearGelu op against the hardware's ceilings, and of each CUDA path ``tune`` chooses between. (The
repository's top-level ``bench/`` holds the device benchmark scripts and their results; this is the package's.)

How a number is made (the same for every model, provider and mode):

* Inputs and outputs live on the device: every input is copied there once and every output is
  pre-allocated there, then bound with IO binding, so a timed run moves no data across PCIe (and the
  addresses stay fixed, which CUDA-graph replay needs).
* Each timed call is wall clock around ``run_with_iobinding``. ONNX Runtime synchronises the CUDA
  stream at the end of every ``Run`` unless the run option ``disable_synchronize_execution_providers``
  is set; we set it to ``"0"`` explicitly, so a call returns only when the GPU is done and the time is
  the latency a caller sees.
* Warm-up runs are excluded. The models being compared take turns in short blocks (~50 ms each, A, B,
  A, B, ...), so clock boost or a noisy neighbour shifts both alike, and repetitions continue until the
  median of the first half of the samples and that of the second half agree within ``rel_tol`` (or the
  time budget runs out; the report then says the median was not stable).
* Which provider really ran each node is read from one profiled run (ORT's profiler records the
  provider per node). A ``FusedLinearGelu`` node on another provider than the one asked for raises
  ``ProviderPlacementError``: a silent CPU fallback would make every number here a lie.

The modules, one step each (sessions come from ``onnxfuse.runtime.create_session``, the chart from
``onnxfuse.plots``, the JSON from ``onnxfuse.atomic``):

    timing        TimingPolicy, Timing, measure: the interleaved timing loop and its statistics
    device_run    DeviceRun, output_shapes: a session with its inputs and outputs bound on the device
    placement     Placement, read_placement, profile_placement: which provider ran which node
    model_bench   bench_models and its report: optimized vs baseline over batch sizes
    op_bench      bench_op and its report: one FusedLinearGelu against the unfused ops and the roofline
    path_bench    gpu_measurer, path_times: each CUDA path of one node shape timed, what ``tune`` chooses from
    environment   SCHEMA and environment(): what every report says about where it was made
    progress      Steps: a progress bar through named steps
"""
