"""Watching a run: the console and metric sinks (console.py, sinks.py), the doctor that explains
what is wrong (doctor.py), and the HTML report (report.py)."""
