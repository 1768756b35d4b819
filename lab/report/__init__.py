"""The report: tables, curves and the analysis, computed from the records alone."""
