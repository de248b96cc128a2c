"""The generated diagnosis benchmark (entry point: bench/diagnosis.py).

spec.py — a training script as data; families.py + models.py — the correct scripts;
operators.py — bug operators; healthy.py — healthy variants; training.py + lit.py —
the user's loops (torch, hand-written updates, Lightning); styles.py — how nndx is
attached; twins.py — the buggy/fixed twin check; runner.py — cases, workers, scoring;
report.py — tables; handwritten.py — the previous hand-written cases, one more family.
"""
