"""The engine: registry metadata, determinism, no torch, ranking and root causes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from nndx.report import SEVERITY_ORDER, CauseCode, DiagnosticReport, Finding
from nndx.rules import REGISTRY, diagnose, get_rule, rank, rules
from nndx.rules.engine import can_explain

from . import lesson
from .broken import BROKEN
from .reports import healthy_mlp


def test_every_rule_has_stable_id_and_docs():
    assert len(rules()) >= 50
    for each in rules():
        assert re.fullmatch(r"NNDX\d{3}", each.id)
        assert isinstance(each.code, CauseCode)
        assert each.severity in SEVERITY_ORDER
        for text in (each.title, each.detects, each.why, each.fix):
            assert len(text) > 15, (each.id, text)
        assert each.id in each.docs() and each.fix in each.docs()


def test_get_rule_is_case_insensitive_and_names_unknown_ids():
    assert get_rule("nndx301").id == "NNDX301"
    with pytest.raises(KeyError, match="NNDX999"):
        get_rule("NNDX999")


def test_diagnose_is_byte_for_byte_deterministic():
    for build in (lesson.lr_10, lesson.dead_relu_bias, lesson.missing_zero_grad, healthy_mlp):
        report = build()
        again = DiagnosticReport.model_validate_json(report.model_dump_json())
        assert diagnose(report).model_dump_json() == diagnose(again).model_dump_json()


def test_diagnose_rejects_a_dict_with_a_clear_error():
    with pytest.raises(TypeError, match="DiagnosticReport"):
        diagnose({"loop": {}})  # type: ignore[arg-type]


def test_empty_report_is_diagnosable_but_never_a_silent_pass():
    diagnosis = diagnose(DiagnosticReport())
    assert diagnosis.rules_run == len(REGISTRY)
    assert [f.code.value for f in diagnosis.findings] == ["NOTHING_MEASURED"]
    assert not diagnosis.healthy


def test_rules_do_not_import_torch():
    code = (
        "import sys, nndx.rules as r; from nndx.report import DiagnosticReport;"
        "r.diagnose(DiagnosticReport.model_validate_json(sys.stdin.read()));"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=lesson.lr_10().model_dump_json(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_explanation_links_are_acyclic():
    """Edges cause -> symptom over all rules; a cycle would make the root ambiguous."""
    graph = {
        a.id: [b.id for b in rules() if can_explain(a.id, b.id)] for a in rules()
    }
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            assert state.get(nxt) != 1, f"cycle: {path + [node, nxt]}"
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [])


def _finding(rule_id: str, severity: str = "warning", score: float = 1.0) -> Finding:
    rule = REGISTRY[rule_id]
    return Finding(rule_id=rule_id, code=rule.code, severity=severity, title=rule.title, symptom="s", fix="f", score=score)


def test_rank_orders_by_severity_then_score():
    ordered = rank([_finding("NNDX503", "warning", 0.2), _finding("NNDX501", "error", 1.0), _finding("NNDX504", "warning", 2.0)])
    assert [f.rule_id for f in ordered] == ["NNDX501", "NNDX504", "NNDX503"]


def test_root_ranks_first_takes_symptom_severity_and_symptom_cites_it():
    # exploding gradients (error) explained by a missing zero_grad finding given here as a warning
    ordered = rank([_finding("NNDX204", "error", 5.0), _finding("NNDX301", "warning", 1.0)])
    assert [f.rule_id for f in ordered] == ["NNDX301", "NNDX204"]
    assert ordered[0].severity == "error" and ordered[0].explained_by is None
    assert ordered[1].explained_by == "NNDX301"


def test_symptoms_with_the_same_code_do_not_explain_each_other():
    ordered = rank([_finding("NNDX102", "error", 3.0), _finding("NNDX104", "warning", 2.0)])
    assert all(f.explained_by is None for f in ordered)


def test_chains_resolve_to_the_root():
    # oscillation -> explained by update ratio (LR_TOO_HIGH) -> explained by missing zero_grad
    ordered = rank([_finding("NNDX104"), _finding("NNDX205"), _finding("NNDX301", "error")])
    by_id = {f.rule_id: f for f in ordered}
    assert by_id["NNDX205"].explained_by == "NNDX301"
    assert by_id["NNDX104"].explained_by == "NNDX301"
    assert ordered[0].rule_id == "NNDX301"


def test_evidence_is_numbers_from_the_report():
    finding = next(f for f in diagnose(BROKEN["NNDX201"]()).findings if f.rule_id == "NNDX201")
    assert finding.evidence["dead_unit_fraction"] == pytest.approx(0.95)
    json.loads(diagnose(lesson.lr_10()).model_dump_json())  # NaN evidence stays valid JSON


def test_an_intervention_confirms_a_symptoms_guess_and_demotes_an_unhelpful_cause():
    from nndx.report import InterventionResult, Interventions, LossPoint, OverfitResult, Probes

    from .reports import act, healthy_mlp, mlp_layers

    base = healthy_mlp()
    dead = [l.model_copy(update={"activation": act(dead=0.7, zero=0.85)}) if l.type == "ReLU" else l for l in mlp_layers()]
    stuck = [LossPoint(step=i, value=2.3 + 0.001 * (i % 3)) for i in range(60)]
    failed = OverfitResult(status="failed", task="classification", steps=200, initial_loss=2.3, final_loss=2.28)
    report = base.model_copy(update={"layers": dead, "loss_history": {"train": stuck}, "probes": Probes(overfit_one_batch=failed)})
    without = diagnose(report)
    assert without.top().code.value == "DEAD_RELU"

    def tried(cause, status):
        return InterventionResult(cause=cause, remedy="r", status=status, steps=50, baseline_initial_loss=2.3,
                                  baseline_final_loss=2.28, remedied_initial_loss=2.3,
                                  remedied_final_loss=0.1 if status == "confirmed" else 2.27)  # fmt: skip

    tested = report.model_copy(update={"interventions": Interventions(results=[
        tried("DEAD_RELU", "not_confirmed"), tried("LR_TOO_LOW", "confirmed")])})  # fmt: skip
    diagnosis = diagnose(tested)
    top = diagnosis.top()
    assert (top.code.value, top.confirmation, top.severity) == ("LR_TOO_LOW", "confirmed", "error")
    assert top.rule_id != "NNDX802"  # the symptom rule's own finding carries the confirmation
    dead_relu = next(f for f in diagnosis.findings if f.code.value == "DEAD_RELU")
    assert dead_relu.confirmation == "not_confirmed" and dead_relu.severity != "error"


def test_a_confirmed_cause_no_rule_named_gets_its_own_finding():
    from nndx.report import InterventionResult, Interventions

    from .reports import healthy_mlp

    result = InterventionResult(cause="WRONG_OUTPUT_ACTIVATION", remedy="the activation on the output removed",
                                status="confirmed", steps=40, baseline_initial_loss=2.3, baseline_final_loss=2.2,
                                remedied_initial_loss=2.3, remedied_final_loss=0.02)  # fmt: skip
    diagnosis = diagnose(healthy_mlp().model_copy(update={"interventions": Interventions(results=[result])}))
    top = diagnosis.top()
    assert (top.rule_id, top.code.value) == ("NNDX803", "WRONG_OUTPUT_ACTIVATION")
    assert top.evidence["remedied_final_loss"] == 0.02


def test_a_faster_lr_on_a_probe_says_little_about_a_run_that_learned():
    """OneCycle or a warm-up starts low: from the initial state, LR x 10 learns faster in
    100 steps, yet the run itself learned. That is context (info), while the same
    confirmation on a run whose loss did not move stays an error."""
    from nndx.report import InterventionResult, Interventions

    from .reports import flat, healthy_mlp, points

    lr_up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 10", status="confirmed",
                               steps=100, baseline_initial_loss=2.3, baseline_final_loss=2.2,
                               remedied_initial_loss=2.3, remedied_final_loss=0.4)  # fmt: skip
    learned = healthy_mlp().model_copy(update={"interventions": Interventions(results=[lr_up])})
    assert diagnose(learned).healthy
    stuck = learned.model_copy(update={"loss_history": {"train": points(flat(3, level=2.3))}})
    assert "LR_TOO_LOW" in {f.code.value for f in diagnose(stuck).findings if f.severity == "error"}
    # a warm-up (or a decay): the probe trained at the LR of one moment of the schedule
    from nndx.report import LRPoint

    warm_up = [LRPoint(step=s, lrs=[1e-3 * min(1.0, (s + 1) / 20)]) for s in range(0, 60, 5)]
    scheduled = stuck.model_copy(update={"loop": stuck.loop.model_copy(update={"lr_history": warm_up})})
    findings = diagnose(scheduled).findings
    assert all(f.confirmation is None and f.severity != "error" for f in findings)  # NNDX103's own warning stays
    assert all(f.rule_id != "NNDX802" or f.severity == "info" for f in findings)


def test_a_faster_lr_is_no_verdict_when_part_of_the_model_gets_no_gradient():
    """A body cut from the loss (or frozen from scratch): LR x 10 makes the head alone learn
    faster on a probe, which says nothing about the LR. The structural cause ranks first."""
    from nndx.report import InterventionResult, Interventions

    from .reports import flat, healthy_mlp, points, with_loop

    lr_up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 10", status="confirmed",
                               steps=100, baseline_initial_loss=2.3, baseline_final_loss=2.2,
                               remedied_initial_loss=2.3, remedied_final_loss=0.4)  # fmt: skip
    stuck = healthy_mlp().model_copy(update={"interventions": Interventions(results=[lr_up]),
                                             "loss_history": {"train": points(flat(3, level=2.3))}})  # fmt: skip
    assert diagnose(stuck).top().code.value == "LR_TOO_LOW"
    frozen = with_loop(stuck, frozen_params=["0.weight", "0.bias"])
    diagnosis = diagnose(frozen)
    assert diagnosis.top().code.value == "FROZEN_PARAMETERS"
    assert all(f.rule_id != "NNDX802" and f.confirmation is None for f in diagnosis.findings)


def test_a_loss_that_computes_its_targets_from_the_output_gets_no_verdict_on_the_lr():
    """DEC's KL(P || Q) with P recomputed from Q on every batch: its objective moves with the model,
    so the run's loss rises as P sharpens, and on a copy any larger LR lowers it (to a collapse).
    The same curve and confirmation on a loss with fixed targets stays an LR_TOO_LOW error."""
    from nndx.report import InterventionResult, Interventions

    from .reports import flat, healthy_mlp, points, with_loop

    lr_up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 100", status="confirmed",
                               steps=100, baseline_initial_loss=2.3, baseline_final_loss=2.25,
                               remedied_initial_loss=2.3, remedied_final_loss=0.4)  # fmt: skip
    stuck = healthy_mlp().model_copy(update={"interventions": Interventions(results=[lr_up]),
                                             "loss_history": {"train": points(flat(3, level=2.3))}})  # fmt: skip
    fixed = diagnose(with_loop(stuck, loss_targets_from_output=False))
    assert (fixed.top().code.value, fixed.top().severity) == ("LR_TOO_LOW", "error")
    moving = diagnose(with_loop(stuck, loss_targets_from_output=True)).findings
    assert all(f.severity == "info" for f in moving if f.code.value == "LR_TOO_LOW")
    assert all(f.rule_id != "NNDX802" and f.confirmation is None for f in moving)


def test_a_remedy_that_only_speeds_up_a_twin_that_learned_is_context():
    """A third of an LSTM head's ReLUs silent at initialisation: re-initialising them makes a
    100-step probe learn much faster, but the untouched twin learned too (42% of its way
    down). With no other rule naming the cause, that is info; the same remedy on a twin
    that did not learn (a dead network) is an error."""
    from nndx.report import DiagnosticReport, InterventionResult, Interventions

    def verdict(baseline_progress: float) -> str:
        result = InterventionResult(cause="DEAD_RELU", remedy="the dead ReLU units re-initialised", status="confirmed",
                                    steps=100, baseline_initial_loss=1.45, baseline_final_loss=1.45 * (1 - baseline_progress),
                                    remedied_initial_loss=1.47, remedied_final_loss=0.006,
                                    baseline_progress=baseline_progress, remedied_progress=0.996)  # fmt: skip
        findings = diagnose(DiagnosticReport(interventions=Interventions(results=[result]))).findings  # a preflight
        return next(f.severity for f in findings if f.rule_id == "NNDX807")

    assert verdict(0.42) == "info"
    assert verdict(0.0) == "error"


def test_a_remedy_confirmed_with_nndxs_own_optimizer_is_a_lead_not_proof():
    """No optimizer was given (a preflight of a loop that updates by hand): the runs trained
    with nndx's Adam at 1e-3. Standardising the targets helping there says as much about
    that Adam as about the targets: a warning. With the user's optimizer it is an error."""
    from nndx.report import InterventionResult, Interventions

    from .reports import flat, healthy_mlp, points

    result = InterventionResult(cause="UNNORMALIZED_TARGETS", remedy="the regression targets standardised",
                                status="confirmed", steps=100, baseline_initial_loss=11.6, baseline_final_loss=11.2,
                                remedied_initial_loss=0.26, remedied_final_loss=0.09)  # fmt: skip

    stuck = healthy_mlp().model_copy(update={"loss_history": {"train": points(flat(2, level=11.6))}})

    def top(optimizer):
        tried = Interventions(results=[result], optimizer=optimizer)
        return diagnose(stuck.model_copy(update={"interventions": tried})).top()

    assert (top("user").rule_id, top("user").severity) == ("NNDX806", "error")
    assert (top("default").rule_id, top("default").severity) == ("NNDX806", "warning")
    assert "nndx's Adam" in top("default").symptom


def test_context_confirmed_with_nndxs_own_optimizer_stays_context():
    """A finding its rule judged context (info), confirmed only by nndx's Adam at 1e-3 (no
    optimizer known): any rescaling helps that Adam's fixed step, so it stays info. The same
    confirmation with the user's optimizer makes it worth a look (warning)."""
    from nndx.report import InterventionResult, Interventions, LossCall, LoopStats

    result = InterventionResult(cause="UNNORMALIZED_TARGETS", remedy="the regression targets standardised",
                                status="confirmed", steps=100, baseline_initial_loss=12.3, baseline_final_loss=11.0,
                                remedied_initial_loss=1.0, remedied_final_loss=0.2)  # fmt: skip
    call = LossCall(loss_type="SmoothL1Loss", output_shape=[32, 1], target_shape=[32, 1], target_dtype="float32",
                    target_mean=3.0, target_std=35.2)  # fmt: skip
    report = DiagnosticReport(task="regression", loop=LoopStats(loss_calls=[call]))

    def severity(optimizer):
        tried = Interventions(results=[result], optimizer=optimizer)
        found = diagnose(report.model_copy(update={"interventions": tried})).findings
        return next((f.severity, f.confirmation) for f in found if f.rule_id == "NNDX506")

    assert severity("default") == ("info", "confirmed")
    assert severity("user") == ("warning", "confirmed")


def test_a_structural_remedy_that_helps_a_probe_is_context_when_the_run_itself_learned():
    """Re-initialising dead units rescued a probe whose baseline (SGD without the loop's
    clipping) got worse, but the user's own run learned: worth knowing, not an alarm. On a run
    whose loss did not move, the same confirmation is an error."""
    from nndx.report import InterventionResult, Interventions

    from .reports import flat, healthy_mlp, points

    result = InterventionResult(cause="DEAD_RELU", remedy="the dead ReLU units re-initialised", status="confirmed",
                                steps=100, baseline_initial_loss=1.40, baseline_final_loss=1.57,
                                remedied_initial_loss=1.40, remedied_final_loss=0.32, baseline_progress=-0.13)  # fmt: skip
    learned = healthy_mlp().model_copy(update={"interventions": Interventions(results=[result], optimizer="user")})
    assert next(f.severity for f in diagnose(learned).findings if f.rule_id == "NNDX807") == "info"
    stuck = learned.model_copy(update={"loss_history": {"train": points(flat(3, level=2.3))}})
    assert next(f.severity for f in diagnose(stuck).findings if f.rule_id == "NNDX807") == "error"


def test_a_hand_written_schedule_voids_lr_remedies_like_an_optimizers_schedule():
    """No optimizer: the step size the Monitor measured is the loop's LR. A per-batch decay took
    it from 0.2 to 1e-12, so a probe at its median LR says nothing about the LR the run meant."""
    from nndx.report import InterventionResult, Interventions, LRPoint

    from .reports import flat, healthy_mlp, points, with_loop

    lr_up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 10", status="confirmed",
                               steps=100, baseline_initial_loss=2.3, baseline_final_loss=2.2,
                               remedied_initial_loss=2.3, remedied_final_loss=0.4)  # fmt: skip
    stuck = healthy_mlp().model_copy(update={"interventions": Interventions(results=[lr_up], optimizer="user"),
                                             "loss_history": {"train": points(flat(3, level=2.3))}})  # fmt: skip
    decayed = [LRPoint(step=s, lrs=[0.2 * 0.1 ** (s // 10)]) for s in range(0, 60, 5)]
    manual = with_loop(stuck, optimizers=[], lr_history=[], effective_lr_history=decayed)
    assert all(f.rule_id != "NNDX802" and f.confirmation is None for f in diagnose(manual).findings)


def test_a_faster_lr_is_no_verdict_when_clipping_shrinks_every_step():
    """clip_grad_norm_(1e-4) on gradients of norm 0.4: every step is 4000x smaller than the LR
    says. LR x 10 helps a probe that trains at those steps, but the cause is the clip."""
    from nndx.report import GradNormPoint, InterventionResult, Interventions

    from .reports import flat, healthy_mlp, points, with_loop

    lr_up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 10", status="confirmed",
                               steps=100, baseline_initial_loss=1.39, baseline_final_loss=1.38,
                               remedied_initial_loss=1.39, remedied_final_loss=0.6)  # fmt: skip
    stuck = healthy_mlp().model_copy(update={"interventions": Interventions(results=[lr_up], optimizer="user"),
                                             "loss_history": {"train": points(flat(3, level=1.386))}})  # fmt: skip
    assert diagnose(stuck).top().code.value == "LR_TOO_LOW"
    clipped = with_loop(stuck, grad_norm_history=[GradNormPoint(step=s, before_clip=0.4, after_clip=1e-4)
                                                  for s in range(0, 60, 5)])  # fmt: skip
    diagnosis = diagnose(clipped)
    assert diagnosis.top().code.value == "GRAD_CLIP_TOO_SMALL"
    assert all(f.confirmation is None and f.rule_id != "NNDX802" for f in diagnosis.findings)


def test_a_remedy_confirmed_in_nndxs_loop_does_not_outrank_a_bug_only_the_users_loop_has():
    """zero_grad never called: the loss climbs. nndx's remedy loop zeroes gradients, so a
    10x LR helping there says what helps a correct loop: a lead (warning) under the loop bug,
    whether a rule named LR_TOO_LOW or only the intervention did."""
    from nndx.report import InterventionResult, Interventions

    from .reports import flat, healthy_mlp, points, with_loop

    lr_up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 10", status="confirmed",
                               steps=100, baseline_initial_loss=2.3, baseline_final_loss=2.2,
                               remedied_initial_loss=2.3, remedied_final_loss=0.4)  # fmt: skip
    for curve in (flat(3, level=2.3), [2.3 * 1.05**i for i in range(60)]):  # stuck, then climbing
        stuck = healthy_mlp().model_copy(update={"interventions": Interventions(results=[lr_up]),
                                                 "loss_history": {"train": points(curve)}})  # fmt: skip
        assert diagnose(stuck).top().code.value == "LR_TOO_LOW"  # a correct loop: the remedy is proof
        findings = diagnose(with_loop(stuck, steps=60, backward_calls=60, zero_grad_calls=0)).findings
        assert findings[0].code.value == "MISSING_ZERO_GRAD"
        lr = next(f for f in findings if f.code.value == "LR_TOO_LOW")
        assert lr.severity == "warning" and "nndx's loop" in (lr.symptom + str(lr.evidence))


def test_a_lower_lr_helping_an_unclipped_probe_is_no_verdict_on_a_loop_that_clips():
    """The PyTorch transformer tutorial: SGD at lr 5 with clip_grad_norm_(0.5) on every step.
    Updates are large (ratio 0.15) but the loss learned: context. LR / 10 helps nndx's remedy
    loop, which does not clip, so it stays context for the clipped loop; without the clip the
    same confirmation makes it worth a look."""
    from nndx.report import GradNormPoint, InterventionResult, Interventions

    from .reports import healthy_mlp, mlp_params, with_loop

    lr_down = InterventionResult(cause="LR_TOO_HIGH", remedy="the learning rate divided by 10", status="confirmed",
                                 steps=100, baseline_initial_loss=3.9, baseline_final_loss=3.0,
                                 remedied_initial_loss=3.9, remedied_final_loss=0.5)  # fmt: skip
    large = healthy_mlp().model_copy(update={"parameters": mlp_params(ratio=0.15),
                                             "interventions": Interventions(results=[lr_down], optimizer="user")})

    def nndx205(report):
        return next((f.severity, f.confirmation) for f in diagnose(report).findings if f.rule_id == "NNDX205")

    assert nndx205(large) == ("warning", "confirmed")
    clipped = with_loop(large, grad_norm_history=[GradNormPoint(step=s, before_clip=2.0, after_clip=0.5)
                                                  for s in range(0, 200, 5)])  # fmt: skip
    assert nndx205(clipped) == ("info", None)
    assert all(f.severity == "info" for f in diagnose(clipped).findings if f.code.value == "LR_TOO_HIGH")


def test_a_guess_its_own_rule_doubts_and_its_remedy_did_not_help_is_context():
    """A Cox model's partial likelihood barely moves below its uninformed level on a noisy task:
    the loss is 'not decreasing' at an LR the range test trains well at, and LR x 10 did not help
    either. Two measurements against LR_TOO_LOW: context, not an alarm. Without the range test's
    word, the unhelpful remedy alone halves the guess and keeps it a warning."""
    from nndx.report import InterventionResult, Interventions, LRPoint, LRRangeResult

    from .reports import flat, healthy_mlp, healthy_probes, points, with_loop

    lr_up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 10",
                               status="not_confirmed", steps=100, baseline_initial_loss=4.6, baseline_final_loss=4.5,
                               remedied_initial_loss=4.6, remedied_final_loss=4.5)  # fmt: skip
    sweep = LRRangeResult(status="passed", lrs=[1e-5, 1.0], losses=[4.6, 4.0], suggested_lr=3e-3,
                          interval_low_lr=1e-3, interval_high_lr=1e-2)  # fmt: skip
    stuck = with_loop(healthy_mlp(), lr_history=[LRPoint(step=i, lrs=[1e-2]) for i in range(0, 200, 5)])
    stuck = stuck.model_copy(update={"loss_history": {"train": points(flat(3, level=4.45, noise=0.03))},
                                     "interventions": Interventions(results=[lr_up])})  # fmt: skip
    in_range = stuck.model_copy(update={"probes": healthy_probes(lr_range=sweep)})
    found = {f.rule_id: f for f in diagnose(in_range).findings}
    assert found["NNDX103"].severity == "info" and found["NNDX103"].confirmation == "not_confirmed"
    out_of_range = stuck.model_copy(update={"probes": healthy_probes(lr_range=sweep.model_copy(update={
        "interval_low_lr": 1.0, "interval_high_lr": 3.0, "suggested_lr": 2.0}))})  # fmt: skip
    assert {f.rule_id: f for f in diagnose(out_of_range).findings}["NNDX103"].severity == "warning"


def test_an_output_activation_that_only_unscaled_targets_put_out_of_reach_is_their_symptom():
    """Udacity's denoising autoencoder given raw 0..255 pixels as targets behind its sigmoid: both
    removing the sigmoid and scaling the targets to [0, 1] made a copy learn. The sigmoid is right
    for [0, 1] images; the targets' scale is the cause, and the output-activation finding folds under
    it. When scaling the targets did not help, the output activation stands on its own."""
    from nndx.report import InterventionResult, Interventions

    from .reports import flat, healthy_data, healthy_split, points

    def tried(cause: str, status: str) -> InterventionResult:
        return InterventionResult(cause=cause, remedy="r", status=status, steps=100, baseline_initial_loss=12500.0,
                                  baseline_final_loss=12420.0, remedied_initial_loss=0.26,
                                  remedied_final_loss=0.02 if status == "confirmed" else 0.25)  # fmt: skip

    split = healthy_split(label_kind="float_continuous", label_dtype="torch.float32", class_counts={},
                          imbalance_ratio=None, target_mean=75.1, target_std=83.3)  # fmt: skip
    report = DiagnosticReport(loss_history={"train": points(flat(1, level=12400.0))},
                              data=healthy_data(train=split, test=None, expected_num_classes=None))  # fmt: skip

    def ranked(targets_status: str) -> list:
        results = [tried("WRONG_OUTPUT_ACTIVATION", "confirmed"), tried("UNNORMALIZED_TARGETS", targets_status)]
        return diagnose(report.model_copy(update={"interventions": Interventions(results=results)})).findings

    both = ranked("confirmed")
    assert (both[0].code.value, both[0].confirmation) == ("UNNORMALIZED_TARGETS", "confirmed")
    activation = next(f for f in both if f.code.value == "WRONG_OUTPUT_ACTIVATION")
    assert activation.explained_by == both[0].rule_id
    assert ranked("not_confirmed")[0].code.value == "WRONG_OUTPUT_ACTIVATION"


def test_a_remedy_that_fits_a_batch_whose_labels_carry_nothing_is_no_evidence():
    """Images shuffled apart from their labels (yunjey's logistic regression, blind round 28): a 1000x LR made a
    copy fit the probe's batch of 100 (it memorised it), and LR_TOO_LOW, 'confirmed', ranked over the
    label probe's error. When the labels carry nothing the inputs predict (the label-alignment probe
    failed, and the run does not generalise), fitting one batch says nothing of a cause: no remedy is
    read. Labels that carry signal keep the remedy's verdict."""
    from nndx.report import InterventionResult, Interventions

    from .broken import BROKEN
    from .reports import flat, points

    stuck = {**BROKEN["NNDX610"]().loss_history, "train": points(flat(3, n=200))}  # at ln(10), as the run was
    shuffled = BROKEN["NNDX610"]().model_copy(update={"loss_history": stuck})
    result = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 1000", status="confirmed",
                                steps=100, baseline_initial_loss=2.37, baseline_final_loss=2.35,
                                remedied_initial_loss=2.37, remedied_final_loss=1.36)  # fmt: skip
    with_remedy = shuffled.model_copy(update={"interventions": Interventions(results=[result])})
    findings = diagnose(with_remedy).findings
    assert findings[0].code.value == "LABELS_MISALIGNED", [(f.rule_id, f.confirmation) for f in findings]
    assert not any(f.confirmation == "confirmed" for f in findings)
    passed = with_remedy.probes.label_alignment.model_copy(update={"status": "passed", "real_accuracy": 0.9})
    aligned = with_remedy.model_copy(update={"probes": with_remedy.probes.model_copy(update={"label_alignment": passed})})
    assert any(f.confirmation == "confirmed" and f.code.value == "LR_TOO_LOW" for f in diagnose(aligned).findings)


def test_an_lr_remedys_title_names_no_factor_its_evidence_contradicts():
    """The collector keeps the first LR factor that works (10, 100 or 1000): tutorials' optimization page
    at SGD 1e-3 was confirmed at x100 under a title that said 'multiplied by 10'."""
    from nndx.report import DiagnosticReport, InterventionResult, Interventions

    up = InterventionResult(cause="LR_TOO_LOW", remedy="the learning rate multiplied by 100", status="confirmed",
                            steps=100, baseline_initial_loss=2.29, baseline_final_loss=2.27,
                            remedied_initial_loss=2.29, remedied_final_loss=0.18)  # fmt: skip
    report = DiagnosticReport(interventions=Interventions(results=[up], optimizer="user"))
    found = next(f for f in diagnose(report).findings if f.rule_id == "NNDX802")
    assert "multiplied by 100" in found.symptom and "multiplied by 10 " not in found.title
