"""Rules: the deterministic engine that turns a DiagnosticReport into a Diagnosis."""
