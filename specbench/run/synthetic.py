"""`specbench run --synthetic-acceptance RATES|FILE`: every method drafts and verifies for real, and a seeded draw from
the stated acceptance keeps the drafts (core/synthetic.py). This module wires it into a run: the rule on each method,
artefacts of the right shape with random weights where a method has none for the model (so drafting costs what it
would), run.yaml's `synthetic_acceptance` block, and the check that the measured acceptance is the stated one (a
broken acceptance path shows as a disagreement beyond sampling error, and the run fails loudly)."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from ..core.acceptance_profile import AcceptanceProfile
from ..core.store import RunFolder
from ..core.synthetic import PerMethodAcceptance, SyntheticAcceptance, read_stated, stated_for
from ..errors import SpecbenchError
from ..methods import get_method
from ..progress import console

# how many standard deviations of the stated draw the measured accepted drafts may stray before the run fails; the
# rule's draws are exact, so a real disagreement is a broken acceptance path, not bad luck
SIGMAS = 5.0
# the published shapes a random artefact takes (Medusa's 4 heads on Vicuna-7B; ParallelSpec's 4 [MASK] tokens)
MEDUSA_HEADS, PARALLEL_MASKS, NOISE = 4, 4, 0.05
EAGLE3_DRAFT_VOCAB = 32000  # the released EAGLE-3 drafters' draft vocabulary (Llama 3.1 8B's)
EXTRAS_KEY = "synthetic_acceptance"  # the target's extras entry tree methods read (methods/tree/batch_trees.SYNTHETIC)


def profile_of(cfg) -> AcceptanceProfile | PerMethodAcceptance | None:
    return read_stated(cfg.synthetic_acceptance) if cfg.synthetic_acceptance else None


def key_of(method) -> str:
    """A method's file key in a folder of stated acceptance: its family (ppd and ppd-typical share ppd.yaml), else
    its name."""
    return getattr(method, "family", None) or method.name


def check_methods(stated, names) -> None:
    """Refuse, before any model loads, a folder of stated acceptance without a file for one of the run's methods."""
    for name in names:
        cls = get_method(name)
        if cls.kind != "baseline":
            stated_for(stated, key_of(cls))


def _meta(target) -> dict:
    from ..core.artifact_files import model_key

    return {"model": target.spec, "model_key": model_key(target), "hidden_size": target.model.config.hidden_size,
            "vocab_size": target.vocab_size, "random_weights": True}


def random_artifact(name: str, target, folder: Path) -> str | None:
    """An artefact of method `name`'s shape with random weights for `target` (a folder, or `untrained` prompt tokens:
    embeddings of random real tokens); None for a method without one."""
    needs = get_method(name).needs
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        if "prompt tokens" in needs:
            return "untrained"
        if "medusa heads" in needs:
            from ..methods.medusa import artifact as mh

            hidden = target.model.config.hidden_size
            heads = mh.MedusaHeads(hidden, MEDUSA_HEADS, target.model.config.num_hidden_layers)
            torch.nn.init.normal_(heads.weight, std=NOISE)
            # each head's own vocabulary projection, as the published heads have (and `plan` prices): [K, V, H], in
            # the run's dtype (a head reading through the target's LM head would read V x H once for all K heads)
            heads.head_weight = torch.nn.Parameter(
                torch.empty(MEDUSA_HEADS, target.vocab_size, hidden, dtype=target.dtype).normal_(std=NOISE),
                requires_grad=False)
            mh.save(heads, folder / "medusa", {**_meta(target), "heads": MEDUSA_HEADS, "layer": heads.layer})
            return str(folder / "medusa")
        if "transfer projections" in needs:
            from ..methods.hidden_transfer import artifact as ht

            layers = list(range(1, min(4, target.model.config.num_hidden_layers)))
            proj = ht.TransferProjections(target.model.config.hidden_size, layers)
            proj.weight.data += NOISE * torch.randn_like(proj.weight)
            ht.save(proj, folder / "transfer", {**_meta(target), "transfer_layers": layers})
            return str(folder / "transfer")
        if "eagle3 drafter" in needs:  # the published layout, with the released drafters' 32k draft vocabulary
            from ..methods.eagle3 import artifact as e3
            from ..methods.eagle3.drafter import initial

            drafter = initial(target.model, torch.arange(min(EAGLE3_DRAFT_VOCAB, target.vocab_size)))
            with torch.no_grad():
                for p in drafter.parameters():
                    p.add_(NOISE * torch.randn_like(p))
            e3.save(drafter, folder / "eagle3", _meta(target))
            return str(folder / "eagle3")
        for kind, masks in (("eagle", 0), ("parallelspec", PARALLEL_MASKS)):
            if f"{kind} drafter" in needs:
                from ..methods.eagle import artifact as fd

                drafter = fd.FeatureDrafter(target.model, masks)
                with torch.no_grad():
                    for p in drafter.parameters():
                        p.add_(NOISE * torch.randn_like(p))
                fd.save(drafter, folder / kind, {**_meta(target), "mask_tokens": masks}, kind)
                return str(folder / kind)
        return None
    finally:
        torch.random.set_rng_state(generator_state)


def artifact_bytes(cfg) -> tuple[tuple[str, int], ...]:
    """The random artefacts a synthetic run may build, in bytes (float32, an upper bound: Medusa's own projections
    are built in the run's dtype), for the fit check's workload (core/model/memory_need.Workload.extra): heads, a
    drafter layer and its input projection, projections.
    Counted for every method that takes one, trained or not (an upper bound); () where the model's shape is unknown."""
    if not cfg.synthetic_acceptance:
        return ()
    from ..core.model.load import model_config
    from ..planning.latency_estimate import ModelShape

    try:
        shape = ModelShape.from_config(model_config(cfg.model))
    except Exception:  # noqa: BLE001  (a model whose config cannot be read here: its loader says why later)
        return ()
    h, layer = shape.hidden, shape.weights_per_layer
    sizes = {"medusa heads": MEDUSA_HEADS * (h * h + h + shape.vocab * h), "transfer projections": 3 * h * h,
             "eagle drafter": layer + 2 * h * h, "parallelspec drafter": layer + 2 * h * h,
             "eagle3 drafter": layer + 3 * h * h + EAGLE3_DRAFT_VOCAB * h}
    out = []
    for name in cfg.methods:
        for need, params in sizes.items():
            if need in get_method(name).needs:
                out.append((f"{name}'s random {need}", 4 * params))
    return tuple(out)


def build(cls, target, options: dict, drafter, label: str):
    """The method, on a random artefact of its shape where none was given and none is found for the model."""
    if options.get("artifact") or "artifact" not in {o.name for o in cls.option_specs}:
        return cls(target, options, drafter)
    try:
        return cls(target, options, drafter)
    except SpecbenchError as exc:
        if not str(exc).startswith("no "):  # only "no <artefact> for <model>": anything else is the user's to fix
            raise
    with tempfile.TemporaryDirectory() as tmp:  # the method holds its weights once built
        made = random_artifact(cls.name, target, Path(tmp))
        if made is None:
            raise SpecbenchError(f"{label}: no artefact for {target.spec} and no random one of its shape to build")
        console.print(f"[dim]{label}: no trained artefact for {target.spec}: random weights of its shape "
                      "(--synthetic-acceptance: its drafting costs what a trained one's would)[/]")
        return cls(target, {**options, "artifact": made}, drafter)


def drafter_for(methods, target, drafter):
    """The run's drafter: the given or shipped one, else (where a method needs one) an untrained drafter of the
    target's first layer and its head, so a drafter method drafts at a real cost."""
    if drafter is not None or not any("drafter" in get_method(m).needs for m in methods):
        return drafter
    from ..methods.sd.drafter import default_drafter, layer_drafter

    if default_drafter(target) is not None:
        return None  # the methods find the shipped one themselves
    console.print(f"[dim]no drafter for {target.spec}: an untrained one of its first layer and its LM head "
                  "(--synthetic-acceptance: it drafts at a real cost)[/]")
    return layer_drafter(target, [0])


def install(methods: dict, profile: AcceptanceProfile | PerMethodAcceptance, seed: int) -> None:
    for method in methods.values():
        if method.kind != "baseline":
            method.acceptance_rule = SyntheticAcceptance(stated_for(profile, key_of(method)), seed)


@dataclass
class Tally:
    """One method label's verifications under the rule: measured accepted drafts against the stated expectation."""

    accepted: int = 0
    mean: float = 0.0
    var: float = 0.0
    tokens: int = 0
    forwards: int = 0
    generations: int = 0

    def add(self, gen) -> None:
        self.accepted += gen.accepted_drafts
        self.mean, self.var = self.mean + gen.synthetic_mean, self.var + gen.synthetic_var
        self.tokens, self.forwards = self.tokens + len(gen.tokens), self.forwards + gen.target_forwards
        self.generations += 1

    def disagrees(self) -> bool:
        return abs(self.accepted - self.mean) > SIGMAS * math.sqrt(self.var) + 1e-6

    def block(self) -> dict:
        return {"accepted_drafts": self.accepted, "expected_accepted_drafts": round(self.mean, 2),
                "sd": round(math.sqrt(self.var), 2), "tau": round(self.tokens / max(self.forwards, 1), 3),
                "agrees": not self.disagrees()}


def count(tallies: dict, label: str, gen) -> None:
    tallies.setdefault(label, Tally()).add(gen)


def _rates(profile: AcceptanceProfile) -> dict:
    return {"conditional": [round(x, 6) for x in profile.conditional],
            "marginal": [round(x, 6) for x in profile.marginal],
            "per_rank": [list(r) for r in profile.per_rank]}


def block(cfg, profile: AcceptanceProfile | PerMethodAcceptance) -> dict:
    """run.yaml's `synthetic_acceptance`: what was stated, before any check (per method for a folder)."""
    if isinstance(profile, PerMethodAcceptance):
        keys = {key_of(get_method(m)) for m in cfg.methods if get_method(m).kind != "baseline"}
        return {"source": profile.source, "given": cfg.synthetic_acceptance,
                "per_method": {k: {"source": profile.of(k).source, **_rates(profile.of(k))} for k in sorted(keys)}}
    return {"source": profile.source, "given": cfg.synthetic_acceptance, **_rates(profile)}


def finish(out: Path, tallies: dict) -> None:
    """Write each method's check into run.yaml and fail loudly where the measured acceptance is not the stated one."""
    meta_path = RunFolder(out).meta
    meta = yaml.safe_load(meta_path.read_text()) or {}
    checks = {label: t.block() for label, t in tallies.items() if t.mean > 0 or t.accepted}
    meta.setdefault("synthetic_acceptance", {})["checks"] = checks
    meta_path.write_text(yaml.safe_dump(meta, sort_keys=False))
    bad = {label: t for label, t in tallies.items() if t.disagrees()}
    if bad:
        said = "; ".join(f"{label}: {t.accepted} accepted drafts, the stated rates expect {t.mean:.1f} "
                         f"(sd {math.sqrt(t.var):.1f})" for label, t in bad.items())
        raise SpecbenchError(f"synthetic acceptance check FAILED ({said}): the method's acceptance path does not "
                             f"keep what the rule drew; the records are in {out}")
