"""The benchmark: closed-loop measurements and their reports."""

from wavepp.bench.measure import Measurement, median_rows, run_closed_loop
from wavepp.bench.report import chrome_trace, print_table, write_json, write_plot, write_trace

__all__ = [
    "Measurement",
    "median_rows",
    "run_closed_loop",
    "chrome_trace",
    "print_table",
    "write_json",
    "write_plot",
    "write_trace",
]
