"""Output quality filters: completions a drafter should not train on, each with its reason.

Pure (no Airflow, no I/O): records in, ``(kept, quarantined)`` out. Applied by the
tokenization stage to a shard's completion records before it tokenizes them; each filter can
be turned off with the run setting ``quality_filters_off``. One module per family:
``repetition`` (loops), ``structure`` (think block, empty answer, tool-call JSON),
``duplicates`` (one answer given to different prompts), ``parts`` (the text split and the
options), ``filters`` (the entry point). Thresholds: benchmarks/bench_quality_filters.py.
"""

from include.quality.filters import filter_records
from include.quality.parts import QUALITY_FILTERS, Parts, QualityOptions, parts_of

__all__ = ["QUALITY_FILTERS", "Parts", "QualityOptions", "filter_records", "parts_of"]
