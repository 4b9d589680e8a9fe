"""Where an evaluation writes, under its dataset run: ``eval/evaluations/<airflow run id>/``.

Beside the held-out split (``include.layout.EVAL_PREFIX``), one folder per Airflow run, every
file create-only: the per-request journal (one segment prefix per configuration), then the
report (``report.md``, ``acceptance.png``, ``report.json``) and the dataset card's "measured
value" section (``card-section.md``: the root card is written once, create-only, and says
where these land).
"""

from __future__ import annotations

from include.layout import EVAL_PREFIX, run_folder

EVALUATIONS_PREFIX = f"{EVAL_PREFIX}/evaluations"
#: The evaluate_drafter report task's outlet: every evaluation of every dataset run (a
#: promotion DAG schedules on it; each event's extra names the run, the gains, the verdict).
EVALUATION_ALIAS = "drafter_evaluations"
REPORT_MD = "report.md"
REPORT_JSON = "report.json"
PLOT_PNG = "acceptance.png"
CARD_SECTION = "card-section.md"


def evaluation_prefix(run_id: str) -> str:
    """The folder of Airflow run ``run_id``'s evaluation (a safe name, as reports use)."""
    return f"{EVALUATIONS_PREFIX}/{run_folder(run_id)}/"


def journal_prefix(run_id: str, config: str) -> str:
    """Where configuration ``config``'s requests are journaled (a drafter name is safe)."""
    return f"{evaluation_prefix(run_id)}journal/{config}/"
