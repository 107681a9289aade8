"""Every method's predicted speedup over `ar` for a model, context, batch and device.

A round of a drafting method at draft length k costs k draft steps, one verification pass of k + 1
rows, the recall index's update (SparseSpec-L) and the view's gather, each priced by the cost model
and the device profile; it yields the accepted tokens and one more (the acceptance curves). The
speedup is those tokens' time under `ar` over the round's time. Unlike the speedup identity
(αk + 1) / (kγ + 1), a verification pass is priced at its own rows (on a device where a few rows
already cost more than one, it costs more than an `ar` step) and the index update is counted.

    from sparsespec.plan import plan, best
    preds = plan("llama-3.1-8b", ctx=65536, batch=1, profile="h100", dtypes=Dtypes("bfloat16", "bfloat16"))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from sparsespec.plan import cost
from sparsespec.plan.acceptance import Acceptance, AcceptanceError, Curve, load_acceptance
from sparsespec.plan.cost import Dtypes, Op
from sparsespec.plan.profile import DeviceProfile, load_profile
from sparsespec.plan.shapes import ModelShape, ShapeError, load_shape


@dataclass(frozen=True)
class MethodSpec:
    """What a method's round does, as the cost model needs it. `drafter`: none (ar), self (the
    target through a view), lookup (prompt lookup), model (a separate drafter model). `view`: full,
    streaming or recall (`refresh`: the recall index is updated every round). `draft_weights`: the
    self-draft's weight format (None: the target's), `draft_head` its lm_head's (None: as the layers).
    `min_budget`: a floor in tokens under the view's share of the context. `acceptance_from`: the
    method whose measured acceptance stands in where this one has none (said in the prediction)."""

    name: str
    drafter: str = "self"
    view: str = "full"
    ratio: float = 0.1
    k_sink: int = 16
    k_recent: int | None = None
    window: int = 16
    refresh: bool = True
    draft_weights: str | None = None
    draft_head: str | None = None
    draft_kv: str | None = None
    acceptance_from: str | None = None
    budget: int | None = None
    min_budget: int = 0


# The shipped method configs (conf/method/*.yaml) the planner prices.
METHODS: dict[str, MethodSpec] = {m.name: m for m in (
    MethodSpec("ar", drafter="none"),
    MethodSpec("magicdec", view="streaming"),
    MethodSpec("magicdec_q", view="streaming", draft_weights="int4", draft_head="int8", acceptance_from="magicdec"),
    MethodSpec("sparsespec_l", view="recall", k_recent=64),
    MethodSpec("sparsespec_l_q", view="recall", k_recent=64, draft_weights="int4", draft_head="int8",
               acceptance_from="sparsespec_l"),
    MethodSpec("snapkv_self", view="recall", refresh=False, acceptance_from="sparsespec_l"),
    MethodSpec("lookup", drafter="lookup"),
    MethodSpec("quantspec", view="full", draft_weights="int4", draft_head="int8", draft_kv="int8"),
    # the verification-guided baselines (conf/method/pillarattn.yaml, vegas.yaml)
    MethodSpec("pillarattn", view="recall", ratio=0.05, k_sink=0, k_recent=9, window=9,
               acceptance_from="sparsespec_l"),
    MethodSpec("vegas", view="recall", ratio=0.05, k_sink=0, k_recent=6, window=2, min_budget=256,
               acceptance_from="sparsespec_l"),
)}


@dataclass
class Prediction:
    """One method's predicted round at its best draft length k (0: ar).

    speedup: tokens/s over ar's at the same context and batch. draft_cost (γ): one draft step over
    one ar step (the identity's γ where a verification pass costs one ar step); ceiling: 1/γ, the
    speedup no acceptance can pass. regime: what most of the round's time is spent on: reading
    weights, reading K/V (cache, view, index), compute beyond the read (a product or attention
    slower than its bytes at the read bandwidth), or host work. parts_ms: a round's time by part."""

    method: str
    speedup: float
    k: int
    draft_cost: float
    ceiling: float
    regime: str
    tokens_per_round: float
    round_ms: float
    ar_step_ms: float
    parts_ms: dict[str, float] = field(default_factory=dict)
    acceptance: str = ""
    verify_ar_steps: float = 1.0

    def as_row(self) -> dict:
        return {"method": self.method, "speedup": round(self.speedup, 4), "k": self.k,
                "draft_cost": round(self.draft_cost, 4),
                "ceiling": None if math.isinf(self.ceiling) else round(self.ceiling, 3), "regime": self.regime,
                "tokens_per_round": round(self.tokens_per_round, 3), "round_ms": round(self.round_ms, 3),
                "ar_step_ms": round(self.ar_step_ms, 3), "verify_ar_steps": round(self.verify_ar_steps, 3),
                "parts_ms": {k: round(v, 3) for k, v in self.parts_ms.items()}, "acceptance": self.acceptance}


class PlanError(ValueError):
    """Bad planner input; the message names the argument and the fix."""


def _time(ops: list[Op], profile: DeviceProfile, dtype: str, buckets: dict[str, float]) -> float:
    """Seconds of `ops`, adding each op's read time to its bucket (weights / kv) and the rest of
    its time to compute (host for lookup)."""
    total = 0.0
    for op in ops:
        t = profile.op_seconds(op, dtype)
        read = profile.read_seconds(op)
        if op.reads == "host":
            buckets["host"] += t
        else:
            buckets["weights" if op.reads == "weights" else "KV"] += min(t, read)
            buckets["compute"] += max(0.0, t - read)
        total += t
    return total


def _buckets() -> dict[str, float]:
    return {"weights": 0.0, "KV": 0.0, "compute": 0.0, "host": 0.0}


def ar_step_seconds(shape: ModelShape, ctx: int, batch: int, profile: DeviceProfile, dtypes: Dtypes,
                    buckets: dict[str, float] | None = None) -> float:
    b = _buckets() if buckets is None else buckets
    t = _time(cost.ar_step(shape, ctx, batch, dtypes), profile, dtypes.weights, b)
    b["host"] += profile.step_overhead_ms / 1e3
    return t + profile.step_overhead_ms / 1e3


def predict(spec: MethodSpec, shape: ModelShape, ctx: int, batch: int, profile: DeviceProfile, dtypes: Dtypes,
            k: int, curve: Curve | None, drafter: ModelShape | None = None) -> Prediction:
    """The round of `spec` at draft length k (ar: k is ignored), priced and divided into ar's time."""
    host = profile.step_overhead_ms / 1e3
    ar_b = _buckets()
    t_ar = ar_step_seconds(shape, ctx, batch, profile, dtypes, ar_b)
    if spec.drafter == "none":
        return Prediction(spec.name, 1.0, 0, 0.0, 1.0, max(ar_b, key=ar_b.get), 1.0, t_ar * 1e3, t_ar * 1e3,
                          {"step": t_ar * 1e3})
    if curve is None:
        raise PlanError(f"method {spec.name}: no acceptance curve")
    # the CPU kernel holds a float32 target's int8 / int4 drafts as GGUF blocks (models/quantized.py)
    d = replace(dtypes, draft_weights=spec.draft_weights or dtypes.draft_weights,
                draft_head=spec.draft_head or dtypes.draft_head, draft_kv=spec.draft_kv or dtypes.draft_kv,
                blocks=dtypes.blocks or (profile.device == "cpu" and dtypes.weights == "float32"))
    b = _buckets()
    parts: dict[str, float] = {}
    accepted = curve.accepted(k)
    share = curve.draft_share
    if spec.drafter == "lookup":
        parts["draft"] = _time(cost.prompt_lookup(ctx, batch), profile, d.weights, b)
        draft_one = parts["draft"]
    else:
        if spec.drafter == "model":
            if drafter is None:
                raise PlanError(f"method {spec.name}: a model drafter needs drafter=CONFIG")
            ops = cost.model_draft_step(drafter, ctx, batch, d)
            view = ctx
        else:
            view = ctx if spec.view == "full" else cost.view_budget(ctx, spec.ratio, spec.budget, spec.k_sink,
                                                                    spec.k_recent)
            if spec.view != "full" and spec.budget is None:
                view = max(view, min(spec.min_budget, ctx))
            ops = cost.draft_step(shape, view, batch, d)
        step_b = _buckets()
        draft_one = _time(ops, profile, d.draft()[0], step_b) + host
        for key, v in step_b.items():
            b[key] += k * v
        b["host"] += k * host
        parts["draft"] = k * draft_one
        if spec.drafter == "self" and spec.view != "full":
            parts["gather"] = _time(cost.view_gather(shape, view, batch, d.draft()[2]), profile, d.weights, b)
    verify_b = _buckets()
    t_verify = _time(cost.verify_pass(shape, ctx, k + 1, batch, d), profile, d.weights, verify_b) + host
    parts["verify"] = t_verify
    if spec.view == "recall" and spec.refresh:
        parts["index"] = _time(cost.index_update(shape, ctx, accepted + 1, batch, d.kv, spec.window), profile,
                               d.weights, b)
    parts["other"] = profile.round_overhead_ms / 1e3
    b["host"] += parts["other"]
    tokens = accepted + 1
    if share < 1.0:  # rounds with no draft: a one-row verification (an ar step) for one token
        for key in parts:
            parts[key] *= share
        parts["no draft"] = (1 - share) * t_ar
        tokens = share * tokens + (1 - share)
    for key, v in verify_b.items():
        b[key] += share * v
    b["host"] += share * host
    round_s = sum(parts.values())
    gamma = draft_one / t_ar
    return Prediction(spec.name, tokens * t_ar / round_s, k, gamma, math.inf if gamma <= 0 else 1 / gamma,
                      max(b, key=b.get), tokens, round_s * 1e3, t_ar * 1e3,
                      {key: v * 1e3 for key, v in parts.items()},
                      f"{curve.method} {curve.source} at {curve.ctx}", t_verify / t_ar)


def _check(ctx: int, batch: int, shape: ModelShape, rope_scaling: str = "auto") -> None:
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1:
        raise PlanError(f"ctx={ctx!r}: a positive number of tokens (4k, 65536)")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PlanError(f"batch={batch!r}: a positive number of sequences")
    if rope_scaling == "none" and shape.max_positions and ctx > shape.max_positions:
        raise PlanError(f"ctx={ctx}: beyond {shape.name}'s {shape.max_positions} trained positions "
                        "(max_position_embeddings) with rope_scaling=none; plan a shorter context, or rope_scaling=auto "
                        "(YaRN past the trained positions, as evaluate.py does by default)")


def plan(model: str | dict | ModelShape, ctx: int, batch: int = 1, profile: str | Path | DeviceProfile = "cpu",
         dtypes: Dtypes | None = None, acceptance: str | Path | Acceptance | None = None,
         methods: list[str] | None = None, k_max: int = 16, data: str | None = "pg19",
         drafter: str | dict | ModelShape | None = None, rope_scaling: str = "auto", stand_ins: bool = True) -> Plan:
    """Every method's prediction at its best draft length (1..k_max, within the positions its curve
    measured), best first; ar is in the list at 1.0. A method without acceptance data is left out
    (named in the result's `missing`); `stand_ins=False` leaves out those priced with another
    method's acceptance too (an upper bound), as a choice that will be run should."""
    shape = load_shape(model)
    _check(ctx, batch, shape, rope_scaling)
    prof = load_profile(profile)
    dtypes = dtypes or Dtypes()
    acc = acceptance if isinstance(acceptance, Acceptance) else load_acceptance(acceptance)
    drafter_shape = load_shape(drafter) if drafter is not None else None
    names = methods or list(METHODS)
    out, missing = [], []
    for name in names:
        if name not in METHODS:
            raise PlanError(f"methods: {name} is not a method the planner knows ({', '.join(METHODS)})")
        spec = METHODS[name]
        if spec.drafter == "none":
            out.append(predict(spec, shape, ctx, batch, prof, dtypes, 0, None))
            continue
        curve = _curve(acc, replace(spec, acceptance_from=None) if not stand_ins else spec, ctx, data)
        if curve is None:
            missing.append(name)
            continue
        preds = [predict(spec, shape, ctx, batch, prof, dtypes, k, curve, drafter_shape)
                 for k in range(1, min(k_max, curve.max_k) + 1)]
        out.append(max(preds, key=lambda p: p.speedup))
    return Plan(sorted(out, key=lambda p: -p.speedup), missing)


class Plan(list):
    """The predictions, best first, and `missing`: the methods left out for want of acceptance data."""

    def __init__(self, preds: list[Prediction], missing: list[str]) -> None:
        super().__init__(preds)
        self.missing = missing


def _curve(acc: Acceptance, spec: MethodSpec, ctx: int, data: str | None) -> Curve | None:
    for name, note in ((spec.name, ""), (spec.acceptance_from, f" (stand-in for {spec.name}: an upper bound)")):
        if name is None:
            continue
        for d in (data, None):
            try:
                c = acc.curve(name, ctx, d)
                if note:
                    c = replace(c, source=c.source + note)
                return c
            except AcceptanceError:
                pass
    return None


def best(model: str | dict | ModelShape, ctx: int, batch: int = 1, profile: str | Path | DeviceProfile = "cpu",
         dtypes: Dtypes | None = None, acceptance: str | Path | Acceptance | None = None,
         methods: list[str] | None = None, **kw) -> Prediction:
    """The method `plan` predicts fastest (ar when nothing beats it)."""
    preds = plan(model, ctx, batch, profile, dtypes, acceptance, methods, **kw)
    if not preds:
        raise PlanError(f"methods={methods}: no acceptance data for any of them; measure with "
                        "`python -m sparsespec.plan.acceptance --runs OUT_DIR --out FILE`")
    return preds[0]


_FORMATS = {"fp": None, "bf16": "bfloat16", "int8": "int8", "int4": "int4"}


def spec_from_method(config: dict) -> MethodSpec:
    """The MethodSpec of an evaluate.py method config (`Method.as_dict()`: name, drafter node with
    its policy node, controller node, lookup). A shipped method's name gives its spec with the
    config's own settings over it; another method is read from its parts (a SelfDrafter's view by
    its policy class, a model drafter otherwise), taking the acceptance of the shipped method with
    the same view as a stand-in."""
    name = config.get("name") or "method"
    drafter = config.get("drafter")
    if not drafter:
        return MethodSpec(name, drafter="lookup" if config.get("lookup") else "none")
    target = str(drafter.get("_target_", ""))
    policy = drafter.get("policy") or {}
    kind = str(policy.get("_target_", "FullKV")).rsplit(".", 1)[-1]
    view = {"FullKV": "full", "StreamingKV": "streaming", "RecallIndex": "recall"}.get(kind, "recall")
    base = METHODS.get(name)
    stand_in = {"streaming": "magicdec", "recall": "sparsespec_l"}.get(view)
    kw = {k: policy[k] for k in ("ratio", "k_sink", "k_recent", "window", "refresh", "budget", "min_budget")
          if k in policy}
    return MethodSpec(
        name, drafter="self" if target.endswith("SelfDrafter") else "model", view=view,
        draft_weights=_FORMATS.get(str(drafter.get("weights", "fp"))),
        draft_head=_FORMATS.get(str(drafter.get("head_weights"))) if drafter.get("head_weights") else None,
        draft_kv=_FORMATS.get(str(drafter.get("kv", "fp"))),
        acceptance_from=(base.acceptance_from if base else stand_in if stand_in != name else None), **kw)


def planned(method: str | dict | MethodSpec, model: str | dict | ModelShape, ctx: int, batch: int = 1,
            profile: str | Path | DeviceProfile = "cpu", dtypes: Dtypes | None = None,
            acceptance: str | Path | Acceptance | None = None, k: int | None = None, data: str | None = "pg19",
            drafter: str | dict | ModelShape | None = None) -> Prediction | None:
    """One method's prediction before it runs (a row's `planned_speedup`): a shipped name, an
    evaluate.py method config or a MethodSpec; at draft length `k` (None: its best). None where there
    is no acceptance data for it (nor a stand-in)."""
    spec = METHODS[method] if isinstance(method, str) and method in METHODS else \
        spec_from_method(method) if isinstance(method, dict) else method
    if not isinstance(spec, MethodSpec):
        raise PlanError(f"method={method}: not a method the planner knows ({', '.join(METHODS)}) nor a method config")
    shape = load_shape(model)
    _check(ctx, batch, shape)
    prof = load_profile(profile)
    dtypes = dtypes or Dtypes()
    if spec.drafter == "none":
        return predict(spec, shape, ctx, batch, prof, dtypes, 0, None)
    acc = acceptance if isinstance(acceptance, Acceptance) else load_acceptance(acceptance)
    curve = _curve(acc, spec, ctx, data)
    if curve is None:
        return None
    d = load_shape(drafter) if drafter is not None else None
    ks = [k] if k else range(1, curve.max_k + 1)
    return max((predict(spec, shape, ctx, batch, prof, dtypes, kk, curve, d) for kk in ks), key=lambda p: p.speedup)


__all__ = ["METHODS", "MethodSpec", "PlanError", "Prediction", "ShapeError", "best", "plan", "planned", "predict",
           "spec_from_method"]
