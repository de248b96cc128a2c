"""Rules: the deterministic engine that turns a DiagnosticReport into a Diagnosis.

    from nndx.rules import diagnose, rules, get_rule
    diagnosis = diagnose(report)          # ranked Findings, pure and deterministic
    for r in rules(): print(r.id, r.code.value, r.severity, r.title)

Importing this package registers every rule (one module per family) and imports no
torch, so a server that only diagnoses JSON stays light.
"""

from nndx.rules import coverage, data, errors, interventions, layers, loop, loss, model, probes  # noqa: F401  (registers the rules)
from nndx.rules.engine import REGISTRY, Hit, Rule, diagnose, get_rule, rank, rules
from nndx.rules.table import MASTER_TABLE, PYTORCH_BUGS, TableRow

__all__ = [
    "REGISTRY",
    "Hit",
    "MASTER_TABLE",
    "PYTORCH_BUGS",
    "Rule",
    "TableRow",
    "diagnose",
    "get_rule",
    "rank",
    "rules",
]
