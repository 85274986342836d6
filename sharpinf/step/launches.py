"""The launches of one step over its fixed buffers, in order: what a plan records.

    body    embed -> every layer (StepKernels.layers)            over N tokens, padding included
    head    gather -> final norm -> LM head (-> sampling)        over R logits rows
    sample  the sampling kernel alone (a step whose masks came later: ForwardPass.sample)

Each reads the step descriptor's device fields (d.d), so the same launches serve every step of a
bucket. ForwardPass records them into plans; the dry run (step/dry_run.py) collects their names
with nothing launched; oracles/trace.py runs embed and head by hand around the layers' units.
"""

from __future__ import annotations

from dataclasses import dataclass

from sharpinf.model.config import ModelConfig
from sharpinf.ops.embedding import embed
from sharpinf.runtime.backend import Backend
from sharpinf.step.buffers import StepDescriptor, Workspace
from sharpinf.step.kernels import StepKernels
from sharpinf.step.slots import SlotState
from sharpinf.step.weights import DeviceWeights


@dataclass
class StepLaunches:
    backend: Backend
    cfg: ModelConfig
    weights: DeviceWeights
    step_kernels: StepKernels
    ws: Workspace
    slots: SlotState

    def body(self, N: int, kv, d: StepDescriptor, shapes: tuple[str, ...] = ()) -> None:
        """embed -> layers for N tokens, the attention in `shapes` (StepKernels.attention_shapes)."""
        self.embed(N, d)
        self.step_kernels.shapes = shapes
        try:
            self.step_kernels.layers(self.weights.layers, kv, d, N)
        finally:
            self.step_kernels.shapes = ()  # launches made by hand choose their own (oracles/trace.py sets them)

    def embed(self, N: int, d: StepDescriptor) -> None:
        """ws.x = the embedding rows of the step's tokens (a fed token's id from ws.sampled)."""
        te, cfg = self.weights.token_embd, self.cfg
        embed(self.backend, te.raw, te.qtype, d.d["token_ids"], self.ws.x, N, cfg.n_embd, cfg.embd_scale,
              feed=(d.d["feed_rows"], self.ws.sampled))

    def head(self, R: int, samples: bool, d: StepDescriptor) -> None:
        """The R logits rows: gather -> final norm -> LM head (-> sampling)."""
        self.step_kernels.head(self.weights.output_norm, self.weights.output, d.d["logits_rows"], R)
        if samples:
            self.sample(R, d)

    def sample(self, R: int, d: StepDescriptor) -> None:
        """One token for each of the R logits rows (the sampling kernel, over the descriptor's rows)."""
        be, cfg, ws, dv, sl = self.backend, self.cfg, self.ws, d.d, self.slots
        sampler = self.step_kernels.sampler
        sampler.launch(be, ws.logits, R, cfg.n_vocab, dv["params"], dv["top_k"], dv["seeds"], dv["steps"], sl.seen_bits,
                       dv["slots"], dv["clear"], dv["add_off"], dv["add_ids"], sl.counts, dv["count_n"], sl.bias,
                       dv["mask_idx"], d.masks, ws.sampled, ws.sample_scratch, acc=getattr(ws, "sample_acc", None))
