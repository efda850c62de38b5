"""``onnxfuse doctor``: this machine's readiness (``doctor.run_doctor``), as a table or JSON."""

from __future__ import annotations

import click

from .options import json_option_or_switch, json_path, verbosity_options
from .render import emit_json, quiet, result_line, stdout_console


@click.command("doctor")
@json_option_or_switch
@verbosity_options
def doctor_command(json_value):
    """Check this machine: versions, ONNX Runtime providers, the op library (found? loads? computes
    right on each usable provider?) and CUDA devices.

    \b
    Exit codes: 0 ready · 2 the op library is missing, does not load, or gives wrong results.
    """
    from ..doctor import run_doctor
    from ..errors import BadInputError
    from ..report_paths import check_report_paths

    report_path = json_path(json_value)
    check_report_paths({"--json": report_path})
    report = run_doctor()
    emit_json(report, report_path)
    if report_path != "-" and not quiet():
        _render_doctor(report)
    elif report_path != "-" and not report.exit_code:  # -q: a failure is the error line
        usable = ", ".join(p["provider"] for p in report.probes if p["ok"])
        result_line(f"ready: onnxfuse {report.onnxfuse_version}, the op library loads and computes right on {usable}")
    if report.exit_code:
        raise BadInputError(report.library_error or "the op library does not work")


def _render_doctor(report) -> None:
    from rich.table import Table

    console = stdout_console()
    table = Table(show_header=False, title="onnxfuse doctor", title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("onnxfuse", report.onnxfuse_version)
    table.add_row("onnxruntime", report.onnxruntime_version)
    table.add_row("onnx", report.onnx_version)
    table.add_row("python", report.python_version)
    table.add_row("providers", ", ".join(report.available_providers))
    table.add_row("op library", report.library_path or "[red]not found[/]")
    for p in report.probes:
        verdict = (f"[green]ok[/] (max abs error {p['max_abs_error']:.1e})" if p["ok"]
                   else f"[red]failed[/]: {p['error']}")
        table.add_row(f"FusedLinearGelu on {p['provider']}", verdict)
    if report.library_path:
        from ..runtime import describe_cpu_gemm

        table.add_row("CPU GEMM", f"{report.cpu_gemm or '?'}: {describe_cpu_gemm(report.cpu_gemm)}")
    if report.cuda_devices:
        for d in report.cuda_devices:
            table.add_row(f"cuda:{d['index']}", f"{d['name']} (sm {d['compute_capability']}, {d['memory_gib']} GiB)")
    else:
        table.add_row("cuda devices", "none")
    if report.gpu_details:
        table.add_row("cuda driver", f"{report.gpu_details['driver_version']} (CUDA {report.gpu_details['cuda_version']})")
        for d in report.gpu_details["devices"]:  # pycuda's view: what the kernels care about
            table.add_row(f"cuda:{d['index']} (pycuda)",
                          f"{d['multiprocessors']} SMs at {d['clock_mhz']} MHz, {d['l2_cache_mib']} MiB L2, "
                          f"{d['peak_memory_bandwidth_gbs']:.0f} GB/s peak; kernels: {d['library_code']}")
    console.print(table)
