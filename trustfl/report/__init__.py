"""Results: JSONL metrics, summaries, plots and tables of run directories."""
from trustfl.core.runfiles import read_metrics, write_json
from trustfl.report.plots import plot_run
from trustfl.report.table import format_table, report_run

__all__ = ["format_table", "plot_run", "read_metrics", "report_run", "write_json"]
