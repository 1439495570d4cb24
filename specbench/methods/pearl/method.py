"""`pearl`: parallel speculative decoding with adaptive draft length (Liu et al., PEARL, Algorithm 2), and the
ablations of its Table 4: `pearl-no-pre` (without pre-verify) and `pearl-no-post` (without post-verify).

State between steps: x = the verified sequence; u = drafts after x not yet verified, with their probabilities qu.
The target's cache holds x[:-1]; its next forward feeds x[-1] and u. Each step runs the drafter and the target
concurrently (concurrency.Executor: threads, CUDA streams, two devices, or sequential as the reference):
  pre-verify  (u empty)  drafter: gamma drafts d after x  ||  target: p after x, which checks d1 only
              accept d1: x += [d1], u = d2..d_gamma, go to post-verify
              reject d1: x += [y ~ norm(max(0, p - q1))] (greedy: the target's argmax), stay in pre-verify
  post-verify (u given)  drafter: gamma drafts w after x+u  ||  target: one forward over x[-1]+u -> checks u, w1
              all kept: x += u + [w1], u = w2..w_gamma, stay (no bonus token: the drafter already went on)
              a rejection: x += kept + [y], drop the rest, roll both caches back, go to pre-verify
Ablations: without pre-verify the drafter drafts alone ("draft" steps) before each post-verify; without
post-verify an accepted first draft is verified by the target alone, with a bonus token ("verify" steps).
Every emitted token is either a draft kept by speculative sampling against a draft drawn from q given the same
verified prefix, or a sample of the residual: the output is distributed exactly as the target's (lossless).
"""

from __future__ import annotations

import torch

from ..timeline import timeline_entry
from .scheduler import MODES, Executor, calibrate, drafter_on
from ...core.machine.timing import now
from ...core.model.load import resolve_device
from ...core.verify import accept
from ..sd.drafting import DraftModelMethod, ModelState, child_generator, draft_tokens
from ..base import Generation, register
from ..options import Option

EXEC = Option("pearl_exec", str, "auto", "how drafter and target overlap; auto = the fastest mode measured here",
              choices=("auto", *MODES))
DRAFT_DEVICE = Option("draft_device", str, None, "the drafter's device in --pearl-exec devices (a second GPU, or cpu)",
                      unset="none")


@register
class Pearl(DraftModelMethod):
    name = "pearl"
    unbatchable = ("its drafter and target run concurrently on one prompt (pre-verify / post-verify); a batch "
                   "would need both sides batched and every sample's adaptive draft length kept in step")
    summary = "PEARL: drafter and target run concurrently (pre-verify / post-verify), adaptive draft length"
    option_specs = DraftModelMethod.option_specs + (EXEC, DRAFT_DEVICE)
    pre_verify = True
    post_verify = True
    # --compile: PEARL decodes over its own caches (methods/sd/drafting.ModelState), never the static engine, so it
    # runs eagerly and declares no compiled widths (core/model/compile.declared_width)
    static_engine = False

    def __init__(self, target, options=None, drafter=None):
        super().__init__(target, options, drafter)
        options = self.options
        dev = resolve_device(options.draft_device, flag="--draft-device") if options.draft_device else None
        self._remote = None
        if dev is not None and dev != target.device and options.pearl_exec in ("devices", "auto"):
            self._remote = drafter_on(self.drafter.model, dev)
        self.calibration = calibrate(target, self._model_for, options.pearl_exec, dev, options.gamma,
                                     self.drafter.spec)
        self.mode = self.calibration.mode
        self.draft_device = dev if self.mode == "devices" else target.device
        self.draft_model = self._model_for(self.mode)
        # default window size: round(c), c = target forward time / drafter forward time (PEARL §4.4.1)
        self.gamma = self.calibration.gamma
        self.executor = Executor(self.mode, target.device, self.draft_device)

    def chosen(self) -> dict:
        cal = self.calibration
        out = {"drafter": self.drafter.spec, "exec": self.mode, "exec_from": cal.reason,
               "step_ms_by_exec": {m: {g: round(t * 1e3, 1) for g, t in by_gamma.items()}
                                   for m, by_gamma in cal.step_s.items()},
               "c_by_exec": {m: round(c, 2) for m, c in cal.c_by_mode.items()},
               "c": round(cal.c, 2), "gamma": self.gamma,
               "gamma_from": "--gamma" if self.options.gamma else f"round(c) of {self.mode}"}
        if cal.skipped:
            out["exec_not_compared"] = cal.skipped
        return out

    def _model_for(self, mode: str):
        return self._remote if mode == "devices" else self.drafter.model

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens, sampling, generator):
        device, stop_ids, ex = self.target.device, self.target.tokenizer.stop_ids, self.executor
        gen = Generation()
        target = ModelState(self.target.model, device, self.vocab)
        drafter = ModelState(self.draft_model, self.draft_device, self.vocab)
        draft_rng = child_generator(generator, self.draft_device)  # the drafter samples in its own thread
        x = input_ids[0].tolist()
        u: list[int] = []
        qu = None
        mode = "pre" if self.pre_verify else "draft"
        origin = now(device)
        done = False
        with ex.session():
            while not done:
                room = max_new_tokens - len(gen.tokens)
                g = max(1, min(self.gamma, room - len(u)))
                seq = x + u

                def draft_job():
                    return draft_tokens(drafter, seq, g, sampling, draft_rng)

                def target_job():
                    return target.feed(target.pending(x) + u, keep=len(u) + 1)  # [len(u)+1, V]

                t0 = now(device)
                d_span = t_span = None
                w, qw = [], None
                # 1. draft and verify, concurrently where the step has both
                if mode in ("pre", "post"):
                    (w, qw), logits, d_span, t_span = ex.both(draft_job, target_job)
                elif mode == "draft":
                    (w, qw), d_span = ex.draft_only(draft_job)
                else:  # "verify"
                    logits, t_span = ex.target_only(target_job)
                qw = None if qw is None else qw.to(device)
                if d_span is not None:  # the drafter's own busy time (it overlaps the target's in pre/post steps)
                    gen.draft_s += d_span.end - d_span.start
                # 2. accept: check u and the first new draft (a bonus token only in "verify" steps)
                checks, n, tok = [], 0, None
                if mode == "draft":
                    new, u, qu, next_mode = [], w, qw, "post"
                else:
                    checks = u + ([] if mode == "verify" else w[:1])
                    parts = [t for t in (qu, None if mode == "verify" or qw is None else qw[:1]) if t is not None]
                    q = torch.cat(parts) if parts and not sampling.greedy else None  # [len(checks), V]
                    if self.acceptance_rule is not None:  # --synthetic-acceptance: a stated draw
                        n, tok = self.acceptance_rule.chain(torch.tensor(checks, device=device), logits, sampling,
                                                            q, generator, bonus=mode == "verify", gen=gen)
                    else:
                        n, tok = accept(torch.tensor(checks, device=device), logits, sampling, q, generator,
                                        bonus=mode == "verify")
                    gen.count_draft(len(checks), n)
                    if tok is None:  # every check passed: the drafts made meanwhile wait for the next verification
                        new, u, qu = checks, w[1:], None if qw is None else qw[1:]
                        next_mode = "post" if self.post_verify else "verify"
                    else:  # a rejection (or verify's bonus token): draft again from the verified sequence
                        new, u, qu = checks[:n] + [tok], [], None
                        next_mode = "pre" if self.pre_verify else "draft"
                # 3. update: x grows by the verified tokens; both caches roll back to what still agrees
                x += new
                target.rollback(x, verified=len(x))
                drafter.rollback(x + u, verified=len(x))
                emitted = 0
                if mode != "draft":
                    done = gen.emit(new, stop_ids, max_new_tokens)
                    emitted = gen.accepted_lengths[-1]  # new cut at a stop token or max_new_tokens
                gen.timeline.append(timeline_entry(mode, origin, t0, now(device), d_span, t_span, len(checks), n,
                                                   emitted, tok is not None))
                mode = next_mode
        gen.draft_forwards = drafter.forwards  # one per draft token, drafts dropped at a rejection included
        return gen


@register
class PearlNoPre(Pearl):
    name = "pearl-no-pre"
    summary = "PEARL ablation without pre-verify: the drafter drafts alone before each post-verify"
    pre_verify = False


@register
class PearlNoPost(Pearl):
    name = "pearl-no-post"
    summary = "PEARL ablation without post-verify: the target verifies alone (with a bonus token)"
    post_verify = False
